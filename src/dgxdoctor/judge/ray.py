"""The Ray cluster verdict: nodes ALIVE, dead and rejoined, GPUs registered, demands waiting for resources.

Shared by ``checks/ray.py`` (the dashboard API, or ``ray status`` when it is down) and ``diagnose`` (pasted
``ray status`` text).
"""

from __future__ import annotations

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.ray_api import ClusterView, RayNode

# The tutorial's deployment: two DGX nodes of 8 GPUs each, one Ray node per machine.
DEFAULT_EXPECTED_NODES = 2


DEFAULT_EXPECTED_GPUS = 16


RECONNECT_REMEDY = (
    "the worker node has not joined the head, or a firewall blocks Ray's ports. On the head: "
    "`sudo ufw allow 6379/tcp && sudo ufw allow 8265/tcp`; on the worker: `ray stop --force` then "
    "`ray start --address=<head IP>:6379 --num-gpus=8 --disable-usage-stats`; then `ray status` on the head must "
    "show 2 nodes and 16.0 GPU. The worker's logs are in /tmp/ray/session_latest/logs/"
)


DEMAND_REMEDY = (
    "work waits for resources the cluster does not have free: a vLLM worker stays PENDING when Ray lacks the "
    "GPUs of the tensor-parallel group. Bring every node back (`ray status` must show 16.0 GPU), or stop what holds "
    "the GPUs (`ray list actors --filter state=ALIVE`), or lower --tensor-parallel-size"
)


def _gpus(value: float) -> str:
    return f"{value:g}"


def _describe(node: RayNode) -> str:
    return f"{node.node_ip or '?'} ({_gpus(node.gpus)} GPUs)"


def cluster_findings(
    view: ClusterView, expected_nodes: int, expected_gpus: int, gpu_evidence: str | None = None
) -> list[Finding]:
    """The cluster verdict, shared by the live check and `dgxdoctor diagnose` of `ray status` text."""
    alive_nodes = [n for n in view.nodes if n.alive]
    alive = view.nodes_alive if view.nodes_alive is not None else len(alive_nodes)
    return [
        *node_findings(view, expected_nodes, alive, {n.node_ip for n in alive_nodes}),
        *gpu_findings(view, expected_gpus, alive == expected_nodes, gpu_evidence),
        *demand_findings(view),
    ]


def _dead_node(node: RayNode, alive_ips: set[str | None], short: bool) -> Finding:
    why = node.state_message or "no state message"
    if node.node_ip in alive_ips:
        message = f"{_describe(node)} died ({why}) and rejoined as a new node"
        return Finding("RAY_NODE_REJOINED", Status.OK, message, node.node_id)
    if short:
        message = f"Ray node {_describe(node)} is DEAD: {why}"
        return Finding("RAY_NODE_DEAD", Status.CRITICAL, message, node.node_id, remedy=RECONNECT_REMEDY)
    message = f"{_describe(node)} died earlier ({why}); the cluster has its expected nodes"
    return Finding("RAY_NODE_DEAD_EARLIER", Status.OK, message, node.node_id)


def node_findings(view: ClusterView, expected: int, alive: int, alive_ips: set[str | None]) -> list[Finding]:
    """Dead, rejoined, failed, missing and unexpected nodes. A dead node matters only while nodes are short."""
    short = alive < expected
    findings = [_dead_node(node, alive_ips, short) for node in view.dead_nodes]
    dead_reported = sum(1 for f in findings if f.code == "RAY_NODE_DEAD")
    for line in view.failures:
        findings.append(
            Finding(
                "RAY_NODE_FAILED",
                Status.CRITICAL if short else Status.WARNING,
                f"ray status lists a recent node failure: {line}",
                evidence=line,
                remedy=RECONNECT_REMEDY,
            )
        )
    unexplained = expected - alive - dead_reported - len(view.failures)
    if short and unexplained > 0:
        message = f"{alive} of {expected} Ray nodes ALIVE: {unexplained} never joined or left without a trace"
        findings.append(Finding("RAY_NODES_MISSING", Status.CRITICAL, message, remedy=RECONNECT_REMEDY))
    elif alive > expected:
        remedy = (
            "a node joined that the deployment does not plan for: `ray status` on the head shows which; "
            "set expected_nodes if the cluster grew on purpose"
        )
        message = f"{alive} Ray nodes ALIVE, {expected} expected"
        findings.append(Finding("RAY_NODES_UNEXPECTED", Status.WARNING, message, remedy=remedy))
    return findings


def gpu_findings(view: ClusterView, expected: int, nodes_complete: bool, evidence: str | None) -> list[Finding]:
    """Fewer GPUs than the tensor-parallel group needs, or more than planned."""
    total = view.gpus_total
    if total is None or total == expected:
        return []
    if total < expected:
        message = (
            f"Ray sees {_gpus(total)} of {expected} GPUs: vLLM's Ray workers stay PENDING "
            "until every GPU of the tensor-parallel group is there"
        )
        return [
            Finding("RAY_GPUS_MISSING", Status.CRITICAL, message, "GPU", evidence=evidence, remedy=RECONNECT_REMEDY)
        ]
    message = f"Ray sees {_gpus(total)} GPUs, {expected} expected" + (
        " (ray status may count a rejoined node's old resources for a few seconds: look again)"
        if nodes_complete
        else ""
    )
    remedy = "check each node's --num-gpus in its `ray start` command; set expected_gpus if intended"
    return [Finding("RAY_GPUS_UNEXPECTED", Status.WARNING, message, "GPU", evidence=evidence, remedy=remedy)]


def demand_findings(view: ClusterView) -> list[Finding]:
    """Tasks, actors and placement groups waiting for resources; those that can never fit say so."""
    total = view.gpus_total
    findings = []
    for demand in view.pending_tasks:
        fits = (
            "" if total is None or demand.gpus <= total else f"; it can never fit: the cluster has {_gpus(total)} GPUs"
        )
        message = f"{demand.count}+ tasks/actors wait for {demand.shape}{fits}"
        findings.append(
            Finding(
                "RAY_PENDING_DEMAND", Status.WARNING, message, demand.shape, evidence=demand.line, remedy=DEMAND_REMEDY
            )
        )
    for demand in view.pending_placement_groups:
        fits = (
            ""
            if total is None or demand.gpus <= total
            else f"; it needs {_gpus(demand.gpus)} GPUs, the cluster has {_gpus(total)}"
        )
        message = f"{demand.count}+ placement groups wait for {demand.shape}{fits}"
        findings.append(
            Finding(
                "RAY_PLACEMENT_GROUP_PENDING",
                Status.WARNING,
                message,
                demand.shape,
                evidence=demand.line,
                remedy=DEMAND_REMEDY,
            )
        )
    return findings


def cluster_summary(view: ClusterView, expected_nodes: int, expected_gpus: int) -> str:
    parts = [f"{view.nodes_alive}/{expected_nodes} nodes ALIVE"]
    if view.dead_nodes:
        parts.append(f"{len(view.dead_nodes)} dead")
    if view.gpus_total is not None:
        used = f", {_gpus(view.gpus_used)} used" if view.gpus_used is not None else ""
        parts.append(f"{_gpus(view.gpus_total)}/{expected_gpus} GPUs{used}")
    waiting = sum(d.count for d in view.pending_tasks)
    groups = sum(d.count for d in view.pending_placement_groups)
    if waiting or groups:
        parts.append(f"{waiting}+ tasks and {groups}+ placement groups pending")
    return ", ".join(parts)


# ---- the head's own services, the worker's raylet ----


def port_not_listening(what: str, port: int) -> Finding:
    """The head's GCS or dashboard port has no listener: that service is down."""
    return Finding(
        "RAY_PORT_NOT_LISTENING",
        Status.CRITICAL,
        f"Ray {what} port {port} is not listening on the head node",
        f"port {port}",
        remedy=f"the head's {what} is down: `ss -lntp | grep {port}`; restart the head with "
        "`ray stop --force` and `ray start --head --port=6379 --dashboard-host=0.0.0.0 --num-gpus=8 "
        "--disable-usage-stats`, then reconnect the worker",
    )


def dashboard_unreachable(url: str, error: str) -> Finding:
    """A head configured by address that does not answer: down, or a firewall in between (the tutorial's error 5).
    A warning: from here it cannot be told which, and a worker's own raylet is judged apart."""
    return Finding(
        "RAY_DASHBOARD_UNREACHABLE",
        Status.WARNING,
        f"the head's dashboard {url} does not answer from here ({error})",
        url,
        remedy="check the head is up (`ray status` there) and that its firewall lets 6379/tcp and "
        "8265/tcp in: `sudo ufw allow 6379/tcp && sudo ufw allow 8265/tcp`",
    )


def dashboard_down(url: str, error: str, running: str) -> Finding:
    """This node is the head (or said to be) and its dashboard does not answer."""
    return Finding(
        "RAY_DASHBOARD_DOWN",
        Status.CRITICAL,
        f"Ray dashboard {url} not answering on the head ({error}); {running}",
        url,
        remedy="if Ray runs, read /tmp/ray/session_latest/logs/dashboard.log; else start the head: "
        "`ray start --head --port=6379 --dashboard-host=0.0.0.0 --num-gpus=8 --disable-usage-stats`",
    )


def raylet_down() -> Finding:
    """A worker node without a running raylet is not part of the cluster."""
    return Finding(
        "RAY_RAYLET_DOWN",
        Status.CRITICAL,
        "no running raylet on this worker node: it is not part of the Ray cluster",
        remedy=RECONNECT_REMEDY,
    )

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
    findings: list[Finding] = []
    alive_nodes = [n for n in view.nodes if n.alive]
    alive_ips = {n.node_ip for n in alive_nodes}
    alive = view.nodes_alive if view.nodes_alive is not None else len(alive_nodes)
    short = alive < expected_nodes

    dead_reported = 0
    for node in view.dead_nodes:
        why = node.state_message or "no state message"
        if node.node_ip in alive_ips:
            findings.append(
                Finding(
                    "RAY_NODE_REJOINED",
                    Status.OK,
                    f"{_describe(node)} died ({why}) and rejoined as a new node",
                    node.node_id,
                )
            )
        elif short:
            dead_reported += 1
            findings.append(
                Finding(
                    "RAY_NODE_DEAD",
                    Status.CRITICAL,
                    f"Ray node {_describe(node)} is DEAD: {why}",
                    node.node_id,
                    remedy=RECONNECT_REMEDY,
                )
            )
        else:
            findings.append(
                Finding(
                    "RAY_NODE_DEAD_EARLIER",
                    Status.OK,
                    f"{_describe(node)} died earlier ({why}); the cluster has its expected nodes",
                    node.node_id,
                )
            )
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
    unexplained = expected_nodes - alive - dead_reported - len(view.failures)
    if short and unexplained > 0:
        findings.append(
            Finding(
                "RAY_NODES_MISSING",
                Status.CRITICAL,
                f"{alive} of {expected_nodes} Ray nodes ALIVE: {unexplained} never joined or left without a trace",
                remedy=RECONNECT_REMEDY,
            )
        )
    elif alive > expected_nodes:
        findings.append(
            Finding(
                "RAY_NODES_UNEXPECTED",
                Status.WARNING,
                f"{alive} Ray nodes ALIVE, {expected_nodes} expected",
                remedy="a node joined that the deployment does not plan for: `ray status` on the head shows which; "
                "set expected_nodes if the cluster grew on purpose",
            )
        )

    if view.gpus_total is not None:
        if view.gpus_total < expected_gpus:
            findings.append(
                Finding(
                    "RAY_GPUS_MISSING",
                    Status.CRITICAL,
                    f"Ray sees {_gpus(view.gpus_total)} of {expected_gpus} GPUs: vLLM's Ray workers stay PENDING "
                    "until every GPU of the tensor-parallel group is there",
                    "GPU",
                    evidence=gpu_evidence,
                    remedy=RECONNECT_REMEDY,
                )
            )
        elif view.gpus_total > expected_gpus:
            findings.append(
                Finding(
                    "RAY_GPUS_UNEXPECTED",
                    Status.WARNING,
                    f"Ray sees {_gpus(view.gpus_total)} GPUs, {expected_gpus} expected"
                    + (
                        " (ray status may count a rejoined node's old resources for a few seconds: look again)"
                        if alive == expected_nodes
                        else ""
                    ),
                    "GPU",
                    evidence=gpu_evidence,
                    remedy="check each node's --num-gpus in its `ray start` command; set expected_gpus if intended",
                )
            )

    for demand in view.pending_tasks:
        fits = (
            ""
            if view.gpus_total is None or demand.gpus <= view.gpus_total
            else (f"; it can never fit: the cluster has {_gpus(view.gpus_total)} GPUs")
        )
        findings.append(
            Finding(
                "RAY_PENDING_DEMAND",
                Status.WARNING,
                f"{demand.count}+ tasks/actors wait for {demand.shape}{fits}",
                demand.shape,
                evidence=demand.line,
                remedy=DEMAND_REMEDY,
            )
        )
    for demand in view.pending_placement_groups:
        fits = (
            ""
            if view.gpus_total is None or demand.gpus <= view.gpus_total
            else (f"; it needs {_gpus(demand.gpus)} GPUs, the cluster has {_gpus(view.gpus_total)}")
        )
        findings.append(
            Finding(
                "RAY_PLACEMENT_GROUP_PENDING",
                Status.WARNING,
                f"{demand.count}+ placement groups wait for {demand.shape}{fits}",
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

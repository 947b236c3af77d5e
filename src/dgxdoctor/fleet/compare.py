"""Pure comparison of N nodes' ``/state`` snapshots: imbalance of the load metrics and drift of the facts.

Under tensor parallelism across two nodes every layer waits for both, so the two nodes' GPUs must be busy
together and their environments identical (the operator tutorial: "both nodes' GPUs have memory in use and
their utilisation rises together; if only machine A moves, the requests are not being distributed", and
"driver and CUDA identical on both machines; driver mismatch is a top cause of multi-node failures").

Imbalance of one metric over nodes is ``(max - min) / max`` (0 = equal, 1 = one node idle). The asymmetric node is
the extreme one in the direction that hurts: the lowest utilisation, the highest error rate (with more nodes, every
one as far off the best). A fact (a version, the
model's fingerprint, an NCCL variable) has no such direction: the odd node is the one off the value a strict majority
of three or more nodes agree on; with two nodes, or no majority, the nodes disagree and none is named (``Drift``).
The verdict is the same whichever node compares. Nothing here does I/O; ``peers.py`` fetches the snapshots.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from msgspec import Struct, field
from msgspec.structs import replace

from dgxdoctor import codes
from dgxdoctor.fleet.store import NODE_LOCAL_FACTS
from dgxdoctor.fleet.stuck_rank import STUCK_CODE, stuck_rank_findings
from dgxdoctor.result import UNKNOWN_GROUP, Finding, Status

Aggregate = Literal["sum", "mean", "max"]


class Rule(Struct, frozen=True):
    """How one sample family is compared between nodes.

    ``per_rail`` compares each ``device/port`` separately (IB rails) instead of one value per node;
    ``bad`` is the direction that names the asymmetric node; ``floor``: when every node is below it the
    cluster is idle on that metric and nothing is compared (0 vs 0.01 utilisation is no finding).
    """

    key: str
    metric: str
    aggregate: Aggregate
    bad: Literal["low", "high"]
    tolerance: float
    floor: float
    code: str
    what: str
    cause: str
    per_rail: bool = False
    unit: str = ""


GIB = 2.0**30

RULES: tuple[Rule, ...] = (
    Rule(
        "gpu_memory_used",
        "dgxdoctor_gpu_memory_used_bytes",
        "sum",
        "low",
        0.25,
        1 * GIB,
        "PEER_GPU_MEMORY_IMBALANCE",
        "GPU memory in use",
        "uneven sharding: this node holds less of the model or KV cache, or its workers did not start "
        "(compare `nvidia-smi --query-gpu=index,memory.used --format=csv` on both nodes)",
        unit="bytes",
    ),
    Rule(
        "gpu_utilization",
        "dgxdoctor_gpu_utilization_ratio",
        "mean",
        "low",
        0.5,
        0.2,
        "PEER_GPU_UTILIZATION_IMBALANCE",
        "mean GPU utilisation",
        "both nodes' GPUs must be busy together under tensor parallelism: requests are not reaching this "
        "node's workers (check --distributed-executor-backend ray and `ray status`) or it waits on the network",
    ),
    Rule(
        "gpu_temperature",
        "dgxdoctor_gpu_temperature_celsius",
        "max",
        "high",
        0.25,
        60.0,
        "PEER_GPU_TEMPERATURE_IMBALANCE",
        "hottest GPU temperature",
        "cooling on this node (fans, inlet air, a blocked chassis): check `nvidia-smi -q -d TEMPERATURE`",
        unit="°C",
    ),
    Rule(
        "gpu_power",
        "dgxdoctor_gpu_power_watts",
        "sum",
        "low",
        0.4,
        800.0,
        "PEER_GPU_POWER_IMBALANCE",
        "GPU power draw",
        "this node does less work (uneven sharding) or is power-capped: check `nvidia-smi -q -d POWER`",
        unit="W",
    ),
    Rule(
        "ib_errors",
        "dgxdoctor_ib_port_errors_per_second",
        "sum",
        "high",
        0.5,
        1.0,
        "PEER_IB_ERROR_IMBALANCE",
        "IB error rate",
        "a degraded link on this rail (cable, transceiver or switch port): check `ibstat` and "
        "`perfquery -x` symbol and receive errors, reseat or replace the cable",
        per_rail=True,
        unit="/s",
    ),
    Rule(
        "ib_rcv_throughput",
        "dgxdoctor_ib_port_rcv_bytes_per_second",
        "sum",
        "low",
        0.5,
        100e6,
        "PEER_IB_RCV_IMBALANCE",
        "IB receive throughput",
        "one-sided network congestion on this rail, or NCCL does not use it here (NCCL_IB_HCA differs)",
        per_rail=True,
        unit="B/s",
    ),
    Rule(
        "ib_xmit_throughput",
        "dgxdoctor_ib_port_xmit_bytes_per_second",
        "sum",
        "low",
        0.5,
        100e6,
        "PEER_IB_XMIT_IMBALANCE",
        "IB transmit throughput",
        "one-sided network congestion on this rail, or NCCL does not use it here (NCCL_IB_HCA differs)",
        per_rail=True,
        unit="B/s",
    ),
    Rule(
        "nccl_busbw",
        "dgxdoctor_nccl_busbw_bytes_per_second",
        "max",
        "low",
        0.3,
        1e9,
        "PEER_NCCL_BANDWIDTH_IMBALANCE",
        "NCCL bus bandwidth",
        "a degraded link, or NCCL fell back to sockets or lost GPUDirect RDMA on this node "
        "(NCCL_DEBUG=INFO shows 'NET/IB' vs 'NET/Socket')",
        unit="B/s",
    ),
    Rule(
        "nccl_rail_busbw",
        "dgxdoctor_nccl_rail_busbw_bytes_per_second",
        "max",
        "low",
        0.3,
        1e9,
        "PEER_NCCL_RAIL_IMBALANCE",
        "NCCL bus bandwidth through this one HCA (per-rail probe)",
        "this rail is slower on this node than on the peer: its HCA, cable or switch port (ibstat, the "
        "infiniband check's counters), or its NCCL_IB_HCA/GID settings differ between the nodes",
        per_rail=True,
        unit="B/s",
    ),
    Rule(
        "vllm_kv_cache_usage",
        "dgxdoctor_vllm_kv_cache_usage_ratio",
        "mean",
        "high",
        0.5,
        0.1,
        "PEER_KV_CACHE_IMBALANCE",
        "vLLM KV-cache usage",
        "uneven load between the instances: the load balancer favours this node, or the instances were "
        "started with different --max-model-len / --gpu-memory-utilization",
    ),
)

RULE_KEYS = frozenset(rule.key for rule in RULES)

# The release of dgxdoctor each node runs, compared as a fact: from the document's ``agent_version`` and ``schema``
# (documents.py), never from the node's facts. Nodes of two releases in a rolling upgrade are still compared: the
# difference is a warning, never a peer UNKNOWN or down.
AGENT_FACT = "dgxdoctor_version"
# documents.UNNUMBERED_SCHEMA: the schema of a document without one (not imported: the check path that prints a
# table loads no document models).
UNNUMBERED_SCHEMA = 1

# Facts whose difference is a fault: (how the key matches, code, status, remedy); the first match wins.
# A pattern ending in "." or "_" is a prefix, one starting with "_" a suffix, "*" matches every key.
_DRIFT: tuple[tuple[tuple[str, ...], str, Status, str], ...] = (
    (
        (AGENT_FACT,),
        "PEER_VERSION_SKEW",
        Status.WARNING,
        "a rolling upgrade of dgxdoctor is not finished: install the same dgxdoctor release on every node (an agent "
        "reads the documents of its own and the previous release, so the nodes are compared meanwhile)",
    ),
    (
        ("vllm_executor", "vllm_mp."),
        "PEER_MP_LAYOUT_DRIFT",
        Status.CRITICAL,
        "vLLM's multiprocessing executor needs the same --nnodes, TP x PP, --master-addr/--master-port and model on "
        "every node (only --node-rank and --headless differ): fix the vLLM unit of the node whose value is not the "
        "runbook's, then restart the mp deployment",
    ),
    (
        ("model_fingerprint", "model_", "host.model_"),
        "PEER_MODEL_MISMATCH",
        Status.CRITICAL,
        "both nodes must load the same weights from the same path: compare `ls -l MODEL_DIR | md5sum` and `mount`",
    ),
    (
        ("nccl_env.",),
        "PEER_NCCL_ENV_DRIFT",
        Status.WARNING,
        "make /etc/profile.d/nccl.sh identical on both nodes (only VLLM_HOST_IP differs) and restart Ray and vLLM",
    ),
    (
        ("driver_version", "cuda_driver_version", "nccl_version"),
        "PEER_VERSION_SKEW",
        Status.CRITICAL,
        "align the GPU driver, CUDA and NCCL on both nodes (nvidia-smi, top right); a driver mismatch is a top "
        "cause of multi-node failures",
    ),
    (
        ("_version", "kernel_release", "container.image"),
        "PEER_VERSION_SKEW",
        Status.WARNING,
        "upgrade both nodes together, never one ahead of the other: ray stop --force, align vLLM / Ray / driver / "
        "kernel versions, rerun nccl-tests and the load-test baseline",
    ),
    (
        ("gpu_", "ib_", "topology.", "host.memory_"),
        "PEER_HARDWARE_DRIFT",
        Status.WARNING,
        "the nodes differ in GPUs, NICs or links: look for a missing GPU, a port down or at a lower rate, or a "
        "changed topology on the node that differs from its build (nvidia-smi -L, ibstat, nvidia-smi topo -m)",
    ),
    (
        ("ras.",),
        "PEER_RAS_VIEW_DRIFT",
        Status.WARNING,
        "the nodes' NCCL RAS see different serving communicators (size, nodes, ranks per node): a node's ranks left "
        "or never joined the job; compare `ncclras` on both nodes and the ras check's findings",
    ),
    (
        ("*",),
        "PEER_FACT_DRIFT",
        Status.WARNING,
        "the nodes should be configured identically: compare this fact on both nodes",
    ),
)

# Set per node on purpose (the tutorial: "only VLLM_HOST_IP changes per machine").
IGNORED_FACTS = NODE_LOCAL_FACTS | {"nccl_env.VLLM_HOST_IP", "nccl_env.NCCL_HOSTID"}
# What a node says of its peers (peer_compare's ``peer_schema.<peer>``): its own view, never compared.
PEER_VIEW_FACT = "peer_schema."

UNSET = "(unset)"


class Imbalance(Struct, frozen=True):
    """The imbalance of one compared metric (``rail`` empty for node-wide metrics) over the nodes of ``group``, or
    over the groups (``values`` by group) when ``group`` is ``ACROSS_GROUPS``."""

    key: str
    rail: str
    ratio: float
    values: Mapping[str, float]
    group: str = ""


# The ``group`` of an imbalance between the serving groups (no group is named "*": config.GroupName).
ACROSS_GROUPS = "*"
GROUP_IMBALANCE_CODE = "PEER_GROUP_IMBALANCE"


class Drift(Struct, frozen=True):
    """A fact the nodes do not agree on: every node's value, and ``odd``, the nodes off the value that a strict
    majority of three or more nodes hold; empty when there is no majority (two nodes, or three values over three)."""

    key: str
    values: Mapping[str, str]
    odd: tuple[str, ...] = ()


class Comparison(Struct, frozen=True):
    findings: tuple[Finding, ...] = ()
    imbalances: tuple[Imbalance, ...] = ()
    drifts: tuple[Drift, ...] = ()
    nodes: tuple[str, ...] = ()
    compared_facts: int = 0


class _NodeView(Struct):
    values: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    facts: dict[str, str] = field(default_factory=dict)
    engine_stalled: bool = False  # its vllm check sees requests in flight and no engine step
    mp_worker_down: tuple[str, ...] = ()  # its vllm_executor check's messages for a headless vLLM not serving


# The vllm check's codes for an engine that makes no step while requests are in flight.
ENGINE_STALL_CODES = frozenset({codes.ENGINE_NO_PROGRESS, codes.ENGINE_HUNG})
# The vllm_executor check's codes (judge/vllm_mp.py) for a worker node whose headless vLLM is not serving.
MP_WORKER_DOWN_CODES = frozenset({"VLLM_MP_HEADLESS_MISSING", "VLLM_MP_HEADLESS_STOPPED", "VLLM_MP_WORKERS_MISSING"})
# During a stall, a tensor-parallel rank waiting in a collective keeps its GPU busy (the NCCL kernel spins for its
# peer, docs/h200/hang-recording-2026-11-30) while the GPUs of the rank that stopped fall idle.
GPU_IDLE_BELOW = 0.1
GPU_SPINNING_FROM = 0.9
# Every code the comparison gives. A node's peer_compare check carries these same verdicts: where the comparison
# itself is shown (the status page, `check --cluster`), they are listed once, with it.
CODES = frozenset(
    {rule.code for rule in RULES}
    | {code for _, code, _, _ in _DRIFT}
    | {"PEER_TP_RANK_STOPPED", "PEER_MP_WORKER_DOWN", STUCK_CODE, GROUP_IMBALANCE_CODE}
)


def compare(snapshots: Iterable[Mapping[str, Any]], tolerances: Mapping[str, float] | None = None) -> Comparison:
    """Compare validated ``/state`` documents (see ``peers.validate_state``); one per node, names unique.

    Within each serving group (the document's ``group``) the nodes are compared as one tensor-parallel replica;
    with several groups, the groups are also compared with each other (``across_groups``). Every node that compares
    the same documents gets the same findings: nothing depends on which one is local."""
    tolerances = tolerances or {}
    members = group_members(list(snapshots))
    if len(members) <= 1:
        group, snaps = next(iter(members.items()), ("", []))
        return _compare_group(snaps, tolerances, group, named=False)
    parts = [_compare_group(snaps, tolerances, group, named=True) for group, snaps in members.items()]
    across, across_imbalances = across_groups({g: [_view(s) for s in snaps] for g, snaps in members.items()},
                                              tolerances)  # fmt: skip
    return Comparison(
        findings=tuple(f for part in parts for f in part.findings) + tuple(across),
        imbalances=tuple(i for part in parts for i in part.imbalances) + tuple(across_imbalances),
        drifts=tuple(d for part in parts for d in part.drifts),
        nodes=tuple(sorted(n for part in parts for n in part.nodes)),
        compared_facts=sum(part.compared_facts for part in parts),
    )


def group_of(snap: Mapping[str, Any]) -> str:
    group = snap.get("group")
    return group if isinstance(group, str) and group else UNKNOWN_GROUP


def group_members(snapshots: list[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The documents by serving group, groups by name. A document that names no group (an agent of a release before
    groups, in a rolling upgrade) joins the one group there is; beside several it is a group of its own, "unknown"."""
    known = sorted({group_of(s) for s in snapshots} - {UNKNOWN_GROUP})
    if len(known) <= 1:
        return {known[0] if known else UNKNOWN_GROUP: snapshots} if snapshots else {}
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for snap in snapshots:
        out[group_of(snap)].append(snap)
    return dict(sorted(out.items()))


def _compare_group(
    snapshots: list[Mapping[str, Any]], tolerances: Mapping[str, float], group: str, named: bool
) -> Comparison:
    """The nodes of one serving group; ``named``: beside other groups, each message says which group."""
    views: dict[str, _NodeView] = {}
    for snap in snapshots:
        views[str(snap["node"])] = _view(snap)
    views = dict(sorted(views.items()))  # by name, so that every node writes the same findings
    nodes = tuple(views)
    if len(views) < 2:
        return Comparison(nodes=nodes)
    findings: list[Finding] = []
    imbalances: list[Imbalance] = []
    for rule, tolerance, rail in _compared(views.values(), tolerances):
        values = {
            node: _aggregate(rule.aggregate, v.values[(rule.key, rail)])
            for node, v in views.items()
            if (rule.key, rail) in v.values
        }
        if len(values) < 2:
            continue
        imbalance, bad, spread = _judged(rule, rail, values, tolerance, group)
        imbalances.append(imbalance)
        if bad:
            odd = ",".join(bad)
            message = f"{spread}; likely cause on {', '.join(bad)}: {rule.cause}"
            subject = f"{odd} {rail}" if rail else odd
            findings.append(Finding(rule.code, Status.WARNING, message, subject=subject, remedy=rule.cause))
    # RAS, GPU and rail views joined name the rank; without RAS, the GPUs alone still name the node.
    stuck = stuck_rank_findings(snapshots, stalled=(n for n, v in views.items() if v.engine_stalled))
    findings.extend(stuck or _stopped_rank(views))
    findings.extend(_mp_worker_down(views))
    drifts, compared = _drift(views)
    findings.extend(drift_finding(d) for d in drifts)
    if named:
        findings = [replace(f, message=f"serving group {group}: {f.message}") for f in findings]
    return Comparison(tuple(findings), tuple(imbalances), tuple(drifts), nodes, compared)


def odd_ones(values: Mapping[str, float], rule: Rule, tolerance: float) -> list[str]:
    """The members (nodes of a group, or groups of the fleet) the rule names: none when every value is under the
    rule's floor (the cluster idles on it) or the spread is within the tolerance. The shipped alert rules compute
    the same verdict in PromQL (``alerts.peer_rules``; ``tests/integration/test_peer_rules_equal.py`` holds them
    equal)."""
    if len(values) < 2 or max(values.values()) < rule.floor or imbalance_ratio(values.values()) <= tolerance:
        return []
    return _bad_side(values, rule, tolerance)


def _compared(views: Iterable[_NodeView], tolerances: Mapping[str, float]) -> Iterator[tuple[Rule, float, str]]:
    """Each rule with its tolerance, once per rail (``""`` for a node-wide metric) that any of ``views`` has."""
    held = list(views)
    for rule in RULES:
        tolerance = tolerances.get(rule.key, rule.tolerance)
        for rail in sorted({rail for v in held for (key, rail) in v.values if key == rule.key}):
            yield rule, tolerance, rail


def _judged(
    rule: Rule, rail: str, values: Mapping[str, float], tolerance: float, group: str
) -> tuple[Imbalance, list[str], str]:
    """One metric (and rail) over ``values`` by member (node, or group): its imbalance, the odd members, and when
    there are any, what the finding says of the spread (whose values against whose, and the tolerance)."""
    imbalance = Imbalance(rule.key, rail, imbalance_ratio(values.values()), values, group)
    bad = odd_ones(values, rule, tolerance)
    if not bad:
        return imbalance, bad, ""
    shown = ", ".join(f"{m} {_fmt(values[m], rule.unit)}" for m in bad)
    others = ", ".join(f"{m} {_fmt(values[m], rule.unit)}" for m in values if m not in bad)
    where = f" on rail {rail}" if rail else ""
    spread = f"{rule.what}{where}: {shown} vs {others} (imbalance {imbalance.ratio:.0%} > {tolerance:.0%})"
    return imbalance, bad, spread


# What likely makes one serving group do less than the others (or err more): the load balancer in front of the groups,
# or the group itself degraded (a slow rank, a degraded link).
GROUP_CAUSE = (
    "the load balancer in front of the serving groups sends this group less (or more) than the others, or the group "
    "itself is degraded (a slow rank, a degraded link: see its nodes' own findings)"
)


def across_groups(
    members: Mapping[str, list[_NodeView]], tolerances: Mapping[str, float]
) -> tuple[list[Finding], list[Imbalance]]:
    """The serving groups compared with each other: per compared metric (and rail), a group's value is the mean of its
    nodes' values; the odd group is named by the same rule as the odd node within a group."""
    findings: list[Finding] = []
    imbalances: list[Imbalance] = []
    for rule, tolerance, rail in _compared((v for views in members.values() for v in views), tolerances):
        values = {}
        for group, views in members.items():
            per_node = [_aggregate(rule.aggregate, v.values[(rule.key, rail)]) for v in views
                        if (rule.key, rail) in v.values]  # fmt: skip
            if per_node:
                values[group] = sum(per_node) / len(per_node)
        if len(values) < 2:
            continue
        imbalance, bad, spread = _judged(rule, rail, values, tolerance, ACROSS_GROUPS)
        imbalances.append(imbalance)
        if bad:
            message = f"serving groups' mean {spread}; likely cause: {GROUP_CAUSE}"
            subject = ",".join(bad)
            findings.append(Finding(GROUP_IMBALANCE_CODE, Status.WARNING, message, subject=subject, remedy=GROUP_CAUSE))
    return findings, imbalances


def _bad_side(values: Mapping[str, float], rule: Rule, tolerance: float) -> list[str]:
    """The nodes on the side that hurts, each off the best value by more than the tolerance: with two nodes the one
    extreme (the same whichever node compares), with more every node that is as far off, not one picked among
    equals. A high value under the rule's floor (0.3 errors/s) is not blamed."""
    if rule.bad == "low":
        top = max(values.values())
        return [n for n, v in values.items() if top > 0 and (top - v) / top > tolerance]
    low = min(values.values())
    return [n for n, v in values.items() if v >= rule.floor and v > 0 and (v - low) / v > tolerance]


def _stopped_rank(views: Mapping[str, _NodeView]) -> list[Finding]:
    """Under a stalled engine, the one node whose GPUs are idle while the others' spin is where the rank stopped.

    A hang on one node stops progress on both (every rank waits in the collective), so the nodes' own vllm checks
    cannot tell which one it is; the GPUs can.
    """
    stalled = sorted(n for n, v in views.items() if v.engine_stalled)
    util = {n: _aggregate("mean", v.values[("gpu_utilization", "")]) for n, v in views.items()
            if ("gpu_utilization", "") in v.values}  # fmt: skip
    idle = [n for n, u in util.items() if u < GPU_IDLE_BELOW]
    spinning = [n for n, u in util.items() if u >= GPU_SPINNING_FROM]
    if not stalled or len(idle) != 1 or not spinning:
        return []
    odd = idle[0]
    busy = ", ".join(f"{n} {util[n]:.0%}" for n in spinning)
    cause = (
        f"on {odd}: its vLLM worker processes (stopped, dead, or stuck outside the GPU), its XIDs, `ray status`; "
        "a restart of the whole cluster clears the collective on every node"
    )
    return [
        Finding(
            "PEER_TP_RANK_STOPPED",
            Status.CRITICAL,
            f"vLLM's engine is stalled ({', '.join(stalled)}): {odd}'s GPUs are idle ({util[odd]:.0%}) while "
            f"{busy} spin in the collective, waiting for it: the tensor-parallel rank on {odd} stopped",
            subject=odd,
            remedy=f"look {cause}",
        )
    ]


def _mp_worker_down(views: Mapping[str, _NodeView]) -> list[Finding]:
    """A worker whose headless vLLM is gone or stopped, named from the head: its own check says so, and every
    rank (the head's too) waits in the collective for it."""
    return [
        Finding(
            "PEER_MP_WORKER_DOWN",
            Status.CRITICAL,
            f"{node}'s headless vLLM is not serving: {'; '.join(messages)[:300]}",
            subject=node,
            remedy=f"on {node}: `systemctl status vllm-worker-mp`, its journal; then restart the mp deployment "
            "(the head's vLLM, the headless workers; start the workers first, then the head)",
        )
        for node, messages in sorted((n, v.mp_worker_down) for n, v in views.items() if v.mp_worker_down)
    ]


# A finding that relays one check of the node it names, whose evidence is as old as that check's result there.
RELAYED_CHECK = {"PEER_MP_WORKER_DOWN": "vllm_executor"}


def relayed_age(finding: Finding, snapshots: Iterable[Mapping[str, Any]]) -> float | None:
    """How old the result a relaying finding rests on was when its node sent the document: the document's
    ``generated_at`` minus that check's ``started_at``, both on that node's clock (so no clock between the nodes
    is compared); None when the finding relays nothing or the document does not say."""
    check = RELAYED_CHECK.get(finding.code)
    if check is None:
        return None
    for snap in snapshots:
        if snap.get("node") != finding.subject:
            continue
        sent = snap.get("generated_at")
        started = next((c.get("started_at") for c in snap.get("checks", ()) if c.get("name") == check), None)
        if isinstance(sent, int | float) and isinstance(started, int | float) and math.isfinite(sent - started):
            return max(0.0, float(sent) - float(started))
    return None


def imbalance_ratio(values: Iterable[float]) -> float:
    vals = list(values)
    top = max(vals)
    if top <= 0:
        return 0.0
    return max(0.0, (top - min(vals)) / top)


def _view(snap: Mapping[str, Any]) -> _NodeView:
    view = _NodeView()
    by_metric: dict[str, list[Rule]] = defaultdict(list)
    for rule in RULES:
        by_metric[rule.metric].append(rule)
    for check in snap.get("checks", ()):
        for sample in check.get("samples", ()):
            value = sample.get("value")
            if not isinstance(value, int | float) or not math.isfinite(value):
                continue
            for rule in by_metric.get(sample.get("name", ""), ()):
                labels = sample.get("labels", {})
                rail = f"{labels.get('device', '?')}/{labels.get('port', '?')}" if rule.per_rail else ""
                view.values[(rule.key, rail)].append(float(value))
    view.facts = {
        k: str(v)
        for k, v in snap.get("facts", {}).items()
        if k not in IGNORED_FACTS and not str(k).startswith(PEER_VIEW_FACT)
    }
    view.facts[AGENT_FACT] = agent_release(snap)
    view.mp_worker_down = tuple(
        str(f.get("message", ""))
        for check in snap.get("checks", ())
        if check.get("name") == "vllm_executor"
        for f in check.get("findings", ())
        if isinstance(f, Mapping) and f.get("code") in MP_WORKER_DOWN_CODES
    )
    view.engine_stalled = any(
        f.get("code") in ENGINE_STALL_CODES
        for check in snap.get("checks", ())
        if check.get("name") == "vllm"
        for f in check.get("findings", ())
        if isinstance(f, Mapping)
    )
    return view


def agent_release(snap: Mapping[str, Any]) -> str:
    """The dgxdoctor release a document names: "0.2.0 (results schema 2)"; a document without ``schema`` is of the
    release before it was numbered (schema 1), whose documents name no version."""
    schema = snap.get("schema", UNNUMBERED_SCHEMA)
    version = snap.get("agent_version")
    if isinstance(version, str) and version:
        return f"{version} (results schema {schema})"
    return f"of an earlier release (results schema {schema}, which sends no version)"


def _aggregate(how: Aggregate, values: list[float]) -> float:
    if how == "sum":
        return sum(values)
    if how == "max":
        return max(values)
    return sum(values) / len(values)


def _drift(views: Mapping[str, _NodeView]) -> tuple[list[Drift], int]:
    drifts: list[Drift] = []
    keys = sorted({k for v in views.values() for k in v.facts})
    # A node reports its NCCL environment only when its nccl_env check ran; among those, a variable
    # set on one node and not on the other is drift too.
    nccl_nodes = [n for n, v in views.items() if any(k.startswith("nccl_env.") for k in v.facts)]
    compared = 0
    for key in keys:
        if key.startswith("nccl_env."):
            values = {n: _env_fact(key, views[n].facts.get(key, UNSET)) for n in nccl_nodes}
        else:
            values = {n: v.facts[key] for n, v in views.items() if key in v.facts}
        if len(values) < 2:
            continue
        compared += 1
        if len(set(values.values())) > 1:
            drifts.append(Drift(key, dict(sorted(values.items())), odd_nodes(values)))
    return drifts, compared


def odd_nodes(values: Mapping[str, str]) -> tuple[str, ...]:
    """The nodes off the value that more than half of the nodes hold, where three or more are compared; else none.

    Two nodes that differ are a disagreement, not one odd node: each node naming the other was the old answer."""
    if len(values) < 3:
        return ()
    value, count = Counter(values.values()).most_common(1)[0]
    if 2 * count <= len(values):
        return ()
    return tuple(sorted(n for n, v in values.items() if v != value))


def drift_finding(drift: Drift) -> Finding:
    """The one finding of a drift: subject the odd node(s), or None with every node's value when none is odd."""
    code, status, remedy = _drift_rule(drift.key)
    if drift.key == AGENT_FACT:
        runs = ", ".join(f"{n} runs dgxdoctor {v}" for n, v in drift.values.items())
        return Finding(code, status, f"the nodes run different releases: {runs}", subject=",".join(drift.odd) or None,
                       remedy=remedy)  # fmt: skip
    shown = ", ".join(f"{n} {v}" for n, v in drift.values.items())
    if not drift.odd:
        return Finding(code, status, f"the nodes disagree on {drift.key}: {shown}", subject=None, remedy=remedy)
    rest = [n for n in drift.values if n not in drift.odd]
    agreed = drift.values[rest[0]]
    odd = ", ".join(f"{n} has {drift.values[n]}" for n in drift.odd)
    message = f"{drift.key}: {odd} where the other {len(rest)} nodes ({', '.join(rest)}) have {agreed}"
    return Finding(code, status, message, subject=",".join(drift.odd), remedy=remedy)


def _drift_rule(key: str) -> tuple[str, Status, str]:
    for patterns, code, status, remedy in _DRIFT:
        if any(_matches(key, pattern) for pattern in patterns):
            return code, status, remedy
    raise AssertionError("the last drift rule matches every key")


def _env_fact(key: str, value: str) -> str:
    """An NCCL variable's value as compared and quoted: one whose name is not known to be harmless is a digest
    (``sources/nccl_env.env_facts``); a peer's agent of an older release may still send its value: it becomes the
    same digest here, never quoted."""
    from dgxdoctor.sources.allowlist import env_allowed
    from dgxdoctor.sources.redact import DIGEST_RE, REDACTED, digest, secret_name

    var = key.removeprefix("nccl_env.")
    if value in (UNSET, REDACTED) or DIGEST_RE.match(value) or (env_allowed(var) and not secret_name(var)):
        return value
    return digest(value)


def _matches(key: str, pattern: str) -> bool:
    if pattern == "*" or key == pattern:
        return True
    if pattern.startswith("_"):
        return key.endswith(pattern)
    return pattern.endswith((".", "_")) and key.startswith(pattern)


def _fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / GIB:.1f} GiB"
    if unit == "B/s":
        return f"{value / 1e9:.2f} GB/s"
    if unit == "":
        return f"{value:.2f}"
    return f"{value:.1f} {unit}"


# The check that runs this comparison inside each node's daemon (checks/peer_compare.py).
COMPARING_CHECK = "peer_compare"


def told_by_the_comparison(check: str, code: str) -> bool:
    """Whether a node's finding is one of the comparison's own verdicts (its peer_compare check compared the same
    nodes). Where the comparison is shown beside the nodes (the status page, ``check --cluster``), such a finding is
    listed once, with the comparison, not once more per node that computed it."""
    return check == COMPARING_CHECK and code in CODES

"""Which rank is stuck: NCCL's RAS view joined with the GPU and rail views of every node, in one finding.

Three views of one stall, read from the nodes' ``/state`` snapshots (pure; ``compare.py`` calls it):
- RAS (checks/ras.py): the processes NCCL's RAS reports unresponsive or dead, with their rank, host, pid and GPU;
  which node a process is on comes from the node whose ras check lists it as local (``dgxdoctor_ras_local_rank_info``),
  else the one node whose own RAS stopped answering (its RAS port is held by the stopped process);
- GPUs (checks/gpu.py): a rank waiting in a collective keeps its GPU at 100 % utilisation with memory utilisation
  and power at idle, a stopped rank's GPU reads 0 % (docs/h200/hang-recording-2026-11-30);
- rails (checks/infiniband.py): a port down, link flaps or errors on the stuck rank's node during the stall.
Where the views disagree (RAS names a rank whose GPU spins like a waiting one, or another node's GPUs are idle), the
finding says so rather than choosing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from msgspec import Struct, field

from dgxdoctor.result import Finding, Status

STUCK_CODE = "PEER_TP_RANK_STUCK"
PROBLEM_METRIC = "dgxdoctor_ras_rank_problem_since_timestamp_seconds"
LOCAL_METRIC = "dgxdoctor_ras_local_rank_info"
STUCK_KINDS = frozenset({"unresponsive", "dead"})
GPU_IDLE_BELOW = 0.1
GPU_SPINNING_FROM = 0.9
MEMORY_IDLE_BELOW = 0.1
_GPU_METRICS = {
    "dgxdoctor_gpu_utilization_ratio": "util",
    "dgxdoctor_gpu_memory_utilization_ratio": "mem",
    "dgxdoctor_gpu_power_watts": "power",
}
REMEDY = (
    "on that node: `py-spy dump --pid PID` and `ps -o stat,wchan -p PID` (T = stopped), `nvidia-smi -i GPU`, its "
    "XIDs (`dmesg`), and the named rail (`ibstat`, `perfquery -x`); every other rank waits for it, so vLLM stays hung "
    "until it resumes or the cluster is restarted (ray stop --force on both nodes, then Ray and vLLM)"
)


class Problem(Struct, frozen=True):
    kind: str
    rank: str
    host: str
    pid: str
    gpu: str
    nvml_gpu: str
    since: float
    reporter: str


class NodeSignals(Struct):
    problems: list[Problem] = field(default_factory=list)
    local: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (host, pid) -> labels
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)  # NVML index -> util / mem / power
    rails: dict[str, list[str]] = field(default_factory=dict)  # device/port -> what is wrong
    rails_seen_at: float = 0.0
    ras_silent: bool = False
    ras_evidence: dict[str, str] = field(default_factory=dict)  # "rank 11" -> NCCL's words


def _rail(b: NodeSignals, labels: Mapping[str, str], what: str) -> None:
    b.rails.setdefault(f"{labels.get('device', '?')}/{labels.get('port', '?')}", []).append(what)


def _sample(b: NodeSignals, node: str, name: str, labels: Mapping[str, str], value: float) -> None:
    if name == PROBLEM_METRIC and labels.get("kind") in STUCK_KINDS:
        b.problems.append(Problem(labels["kind"], labels.get("rank", ""), labels.get("host", ""),
                                  labels.get("pid", ""), labels.get("gpu", ""), labels.get("nvml_gpu", ""),
                                  value, node))  # fmt: skip
    elif name == LOCAL_METRIC:
        b.local[(labels.get("host", ""), labels.get("pid", ""))] = dict(labels)
    elif name in _GPU_METRICS and "gpu" in labels:
        b.gpus.setdefault(labels["gpu"], {})[_GPU_METRICS[name]] = value
    elif name == "dgxdoctor_ib_port_up" and value == 0:
        _rail(b, labels, "link down")
    elif name == "dgxdoctor_ib_port_link_flaps" and value > 0:
        _rail(b, labels, f"{value:.0f} link flap(s)")
    elif name == "dgxdoctor_ib_port_errors_per_second" and value > 0:
        _rail(b, labels, f"errors at {value:.1f}/s")


def signals(snapshot: Mapping[str, Any]) -> NodeSignals:
    out = NodeSignals()
    node = str(snapshot.get("node", "?"))
    for check in snapshot.get("checks", ()):
        for s in check.get("samples", ()):
            value = s.get("value")
            if isinstance(value, int | float):
                _sample(out, node, str(s.get("name", "")), s.get("labels", {}), float(value))
        if check.get("name") == "infiniband":  # when: its check's start on that node's clock (peers send it too)
            out.rails_seen_at = float(check.get("started_at") or 0.0)
        if check.get("name") == "ras":
            # silent = critical with dgxdoctor_ras_up 0 (the status and samples say it, whatever the findings' words)
            up = [s.get("value") for s in check.get("samples", ()) if s.get("name") == "dgxdoctor_ras_up"]
            out.ras_silent = check.get("status") == "critical" and up == [0.0]
            for f in check.get("findings", ()):  # the reporting node's own words, a peer's included
                message = str(f.get("message", ""))
                if "; NCCL: " in message and f.get("subject"):
                    out.ras_evidence[str(f["subject"])] = message.split("; NCCL: ", 1)[1]
    return out


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))


def _owner(p: Problem, views: Mapping[str, NodeSignals]) -> tuple[str | None, str]:
    """(the node the stuck process runs on, how that is known)."""
    listed = [n for n, v in views.items() if (p.host, p.pid) in v.local]
    if len(listed) == 1:
        return listed[0], "its ras check lists the process"
    silent = [n for n, v in views.items() if v.ras_silent]
    if len(silent) == 1:
        return silent[0], "its own RAS stopped answering"
    return None, ""


def _gpu_index(p: Problem, owner: str | None, views: Mapping[str, NodeSignals]) -> str:
    if owner is not None:
        local = views[owner].local.get((p.host, p.pid))
        if local and local.get("nvml_gpu"):
            return local["nvml_gpu"]
    return p.nvml_gpu or p.gpu


def _gpu_view(owner: str, gpu: str, views: Mapping[str, NodeSignals]) -> tuple[str, list[str]]:
    """(what the GPUs show, disagreements)."""
    disagree: list[str] = []
    own = views[owner].gpus.get(gpu)
    waiting = [n for n, v in views.items() if n != owner and _spinning(v.gpus.values())]
    idle_elsewhere = [n for n, v in views.items() if n != owner and v.gpus and _all_idle(v.gpus.values())]
    parts: list[str] = []
    if own is None:
        parts.append(f"{owner} reports no GPU {gpu} sample")
    elif own.get("util", 1.0) < GPU_IDLE_BELOW:
        parts.append(f"{owner}'s GPU {gpu} idle ({own['util']:.0%}), as a stopped rank's")
    elif own.get("util", 0.0) >= GPU_SPINNING_FROM and own.get("mem", 1.0) < MEMORY_IDLE_BELOW:
        disagree.append(f"{owner}'s GPU {gpu} spins like a waiting rank's ({own['util']:.0%}, memory "
                        f"{own.get('mem', 0.0):.0%}): the process may be stuck off the GPU")  # fmt: skip
    else:
        parts.append(f"{owner}'s GPU {gpu} at {own.get('util', 0.0):.0%}")
    if waiting:
        parts.append(f"{', '.join(waiting)}'s GPUs spin in the collective, waiting for it")
    if idle_elsewhere:
        disagree.append(f"{', '.join(idle_elsewhere)}'s GPUs are idle too")
    return "; ".join(parts), disagree


def _spinning(gpus: Iterable[Mapping[str, float]]) -> bool:
    utils = [g["util"] for g in gpus if "util" in g]
    return bool(utils) and max(utils) >= GPU_SPINNING_FROM


def _all_idle(gpus: Iterable[Mapping[str, float]]) -> bool:
    utils = [g["util"] for g in gpus if "util" in g]
    return bool(utils) and max(utils) < GPU_IDLE_BELOW


def _rails(owner: str, view: NodeSignals) -> str:
    if not view.rails:
        return ""
    seen = f" (seen {_clock(view.rails_seen_at)})" if view.rails_seen_at else ""
    return "; ".join(f"{owner} {rail} {', '.join(what)}{seen}" for rail, what in sorted(view.rails.items()))


def _one(p: Problem, views: Mapping[str, NodeSignals], stalled: list[str]) -> Finding:
    owner, how = _owner(p, views)
    gpu = _gpu_index(p, owner, views)
    where = f"on {owner}" if owner else f"on host {p.host or '?'} (no node lists its process)"
    head = f"rank {p.rank or '?'} {where}, GPU {gpu or '?'}, {p.kind} since {_clock(p.since)} (NCCL RAS, pid {p.pid})"
    parts = [head]
    disagree: list[str] = []
    if owner is not None:
        gpus, disagree = _gpu_view(owner, gpu, views)
        parts.extend(x for x in (gpus, _rails(owner, views[owner])) if x)
        parts.append(f"node known as {how}")
    if stalled:
        parts.append(f"vLLM's engine is stalled on {', '.join(stalled)}")
    words = next((v.ras_evidence[f"rank {p.rank}"] for v in views.values() if f"rank {p.rank}" in v.ras_evidence), "")
    message = "; ".join(parts)
    if disagree:
        message += "; the views disagree: " + "; ".join(disagree)
    if words:
        message += f"; NCCL: {words}"
    return Finding(STUCK_CODE, Status.CRITICAL, message, subject=f"{owner or p.host} rank {p.rank}".strip(),
                   remedy=REMEDY)  # fmt: skip


def stuck_rank_findings(snapshots: Iterable[Mapping[str, Any]], stalled: Iterable[str] = ()) -> list[Finding]:
    """One finding per process RAS reports unresponsive or dead (deduplicated over the reporting nodes)."""
    views = {str(s.get("node", "?")): signals(s) for s in snapshots}
    seen: dict[tuple[str, str], Problem] = {}
    for v in views.values():
        for p in v.problems:
            key = (p.host, p.pid)
            if key not in seen or p.since < seen[key].since:
                seen[key] = p
    stalled_nodes = sorted(stalled)
    return [_one(p, views, stalled_nodes) for p in sorted(seen.values(), key=lambda p: (p.since, p.rank))]

"""Verdicts on NCCL's RAS view of the serving job: ranks that stopped answering or died, a communicator smaller
than the parallel layout, and RAS itself not answering while vLLM serves. Values in, Findings out.

RAS (NCCL 2.24+) keeps every NCCL process of the job in a mesh of keep-alives: a process that misses them is
"unresponsive" (no data in the RAS collective behind STATUS) and after 60 s "considered dead" (RAS_PEER_DEAD_TIMEOUT,
src/ras/ras_internal.h:227 at v2.28.9-1). A rank stopped in a collective shows up there while its peers, waiting for
it, still answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from msgspec import Struct

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.ras_report import RankIssue, RasReport

# The findings that say the engine stopped making progress, or that a collective timed out: the moments to ask RAS.
ASK_RAS_CODES = frozenset({"ENGINE_NO_PROGRESS", "ENGINE_HUNG", "NCCL_TIMEOUT"})

REMEDY_STUCK = (
    "look at that process on that node: `py-spy dump --pid PID` (where it waits), its GPU (`nvidia-smi -i GPU`, "
    "XIDs in `dmesg`), `ps -o stat,wchan -p PID` (T = stopped); the other ranks wait for it in the collective, so "
    "vLLM is hung on every node until it resumes or the whole cluster is restarted (ray stop --force on both nodes)"
)
REMEDY_DEAD = (
    "the process is gone or cut off from the RAS network: its node's kernel log (OOM killer, XIDs), the network "
    "between the nodes; vLLM cannot recover a lost rank: restart Ray and vLLM on both nodes"
)
REMEDY_ERROR = "read that rank's log for the NCCL error (NCCL_DEBUG=WARN); the communicator is unusable: restart vLLM"
REMEDY_SMALL = (
    "vLLM's world communicator must span tensor_parallel_size x pipeline_parallel_size ranks: a node's workers did "
    "not join (ray status: GPUs per node; the Ray worker node's raylet), or vLLM runs with a smaller layout than "
    "configured"
)
REMEDY_UNREACHABLE = (
    "NCCL's RAS does not answer on this node: NCCL_RAS_ENABLE=0 in vLLM's environment, a different NCCL_RAS_ADDR, "
    "NCCL older than 2.24, or a firewall on the port; ncclras -h HOST -p PORT asks the same"
)
REMEDY_SILENT = (
    "the NCCL process holding the RAS port accepts but does not answer: it is stopped (SIGSTOP, a debugger) or its "
    "process is hung; `ss -ltnp | grep PORT` names it, `ps -o stat -p PID` shows T for stopped"
)

_CODES = {"unresponsive": "RAS_RANK_UNRESPONSIVE", "dead": "RAS_RANK_DEAD", "error": "RAS_RANK_ERROR"}
_WORDS = {"unresponsive": "unresponsive to NCCL's RAS", "dead": "considered dead by NCCL's RAS",
          "error": "reported an NCCL error", "behind": "behind the other ranks", "status": "in a different state",
          "nocomm": "no longer a member"}  # fmt: skip


class StuckProcess(Struct, frozen=True):
    """One NCCL process RAS reports, with every rank line about it (a process has one rank per communicator)."""

    kind: str
    host: str | None
    pid: int | None
    gpu: int | None
    nvml_gpu: int | None
    ranks: tuple[int, ...]
    evidence: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.host or '?'}:{self.pid if self.pid is not None else '?'}"


_SEVERITY = ("dead", "unresponsive", "error", "behind", "status", "nocomm")


def stuck_processes(report: RasReport) -> list[StuckProcess]:
    """RAS's issues grouped by process, the serving communicator's rank first, worst kind per process."""
    serving = report.serving()
    serving_key = serving.key if serving else ""
    by_proc: dict[tuple[str | None, int | None], list[RankIssue]] = {}
    for issue in report.issues:
        by_proc.setdefault((issue.host, issue.pid) if issue.pid is not None else (None, issue.rank), []).append(issue)
    out: list[StuckProcess] = []
    for (host, _), issues in by_proc.items():
        kind = min((i.kind for i in issues), key=_SEVERITY.index)
        # the world communicator's rank (the largest group in text, serving.key in JSON) names the rank first
        ranked = sorted((i for i in issues if i.rank is not None), key=lambda i: (i.comm != serving_key, -len(i.comm)))
        ranks = tuple(dict.fromkeys(i.rank for i in ranked if i.rank is not None))
        first = issues[0]
        gpus = next((i.gpus for i in issues if i.gpus), ())
        nvml = next((i.nvml_gpus for i in issues if i.nvml_gpus), ())
        out.append(
            StuckProcess(
                kind,
                host,
                first.pid,
                gpus[0] if gpus else None,
                nvml[0] if nvml else None,
                ranks,
                tuple(dict.fromkeys(i.evidence for i in issues)),
            )
        )
    return out


def clock(epoch: float) -> str:
    """'12:03:10 UTC'."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))


def describe(proc: StuckProcess) -> str:
    """'rank 11 (GPU 3, process 48213 on 10.0.0.2)'."""
    who = f"rank {proc.ranks[0]}" if proc.ranks else "a process"
    gpu = f"GPU {proc.gpu}" + (f" (NVML {proc.nvml_gpu})" if proc.nvml_gpu not in (None, proc.gpu) else "")
    parts = [gpu] if proc.gpu is not None else []
    parts.append(f"process {proc.pid if proc.pid is not None else '?'} on {proc.host or '?'}")
    return f"{who} ({', '.join(parts)})"


def rank_findings(report: RasReport, since: Mapping[str, float] | None = None) -> list[Finding]:
    """One finding per process RAS reports as unresponsive, dead, erroring or behind; NCCL's lines as evidence."""
    findings: list[Finding] = []
    for proc in stuck_processes(report):
        code = _CODES.get(proc.kind, "RAS_RANK_BEHIND")
        status = Status.WARNING if code == "RAS_RANK_BEHIND" else Status.CRITICAL
        remedy = {"dead": REMEDY_DEAD, "error": REMEDY_ERROR}.get(proc.kind, REMEDY_STUCK)
        others = (
            f" (also rank(s) {', '.join(map(str, proc.ranks[1:]))} of other communicators)" if proc.ranks[1:] else ""
        )
        evidence = " | ".join(line.replace("\n", " / ") for line in proc.evidence)
        first = (since or {}).get(proc.key)
        when = f" since {clock(first)}" if first is not None else ""
        findings.append(
            Finding(
                code,
                status,
                f"{describe(proc)} {_WORDS[proc.kind]}{when}{others}; NCCL: {evidence}",
                subject=f"rank {proc.ranks[0]}" if proc.ranks else proc.key,
                remedy=remedy,
            )
        )
    if report.timeouts and not findings:
        findings.append(
            Finding(
                "RAS_COLLECTIVE_TIMEOUTS",
                Status.WARNING,
                f"NCCL's RAS met {report.timeouts} communication timeout(s) while gathering communicator data, "
                "yet names no rank: a slow or congested link between the nodes",
                subject="ras",
                remedy="compare the IB counters of both nodes (the infiniband check), rerun with a longer timeout",
            )
        )
    return findings


def layout_findings(report: RasReport, expected_ranks: int) -> list[Finding]:
    """The serving communicator against tensor_parallel_size x pipeline_parallel_size (0: not known)."""
    serving = report.serving()
    if serving is None:
        return [
            Finding(
                "RAS_NO_COMMUNICATOR",
                Status.WARNING,
                "NCCL's RAS answers but reports no communicator: vLLM has not initialised NCCL yet, or its ranks "
                "already destroyed theirs",
                subject="ras",
                remedy=REMEDY_SMALL,
            )
        ]
    if expected_ranks and serving.size < expected_ranks:
        return [
            Finding(
                "RAS_COMMUNICATOR_SMALL",
                Status.CRITICAL,
                f"the largest NCCL communicator has {serving.size} rank(s) over {serving.nodes} node(s), fewer than "
                f"the {expected_ranks} of tensor_parallel_size x pipeline_parallel_size",
                subject="ras",
                remedy=REMEDY_SMALL,
            )
        ]
    return []


def unreachable_finding(kind: str, detail: str, serving: bool) -> Finding | None:
    """RAS did not answer (``kind`` as sources.ras_client.RasError): a finding only while vLLM serves across GPUs
    (or the check is ``required``)."""
    if not serving:
        return None
    if kind == "timeout":
        return Finding("RAS_SILENT", Status.CRITICAL, f"NCCL's RAS accepted but did not answer: {detail}",
                       subject="ras", remedy=REMEDY_SILENT)  # fmt: skip
    return Finding("RAS_UNREACHABLE", Status.WARNING, f"NCCL's RAS cannot be read: {detail}",
                   subject="ras", remedy=REMEDY_UNREACHABLE)  # fmt: skip


def asks_ras(codes: Iterable[str]) -> bool:
    """Whether a check's findings are a moment to ask RAS now (a stalled engine, an NCCL timeout in the logs)."""
    return any(code in ASK_RAS_CODES for code in codes)

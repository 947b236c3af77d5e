"""ras: NCCL's RAS view of the serving job, read over its client socket (localhost:28028, or NCCL_RAS_ADDR).

By hand: ``ncclras`` (or ``ncclras -v``; ``-f json`` from NCCL 2.28.7) on a node of the job; NCCL_RAS_ADDR when the
job set one: ``ncclras -h 127.0.0.1 -p 28031``.

When healthy it exports the serving communicator's size and spread over nodes (a fact compared between nodes, and
a finding when smaller than tensor_parallel_size x pipeline_parallel_size). During a stall it names the ranks RAS
sees unresponsive or dead, with NCCL's words; the daemon wakes this check when the vllm check sees a stalled engine
or the logs show an NCCL timeout (judge.ras.ASK_RAS_CODES). Which ranks are this node's: those whose process runs
here and reads RAS at the same address (its NCCL_RAS_ADDR, or the default), so two agents on one host stay apart.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.ras import layout_findings, rank_findings, stuck_processes, unreachable_finding
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S, HOUR_S
from dgxdoctor.sources.nccl_env import parse_environ
from dgxdoctor.sources.procfs import ProcessInfo, iter_processes, read_process, trusted_process
from dgxdoctor.sources.ras_client import DEFAULT_HOST, DEFAULT_PORT, RasError, RasReply, parse_ras_addr, query
from dgxdoctor.sources.ras_report import RasReport, RasReportError, parse_report
from dgxdoctor.sources.vllm_api import is_vllm_process
from dgxdoctor.validation import ByteCount

RAS_UP = MetricSpec("dgxdoctor_ras_up", "1 if NCCL's RAS answered a status query in the last run, else 0")
RAS_SECONDS = MetricSpec(
    "dgxdoctor_ras_query_duration_seconds", "seconds the last RAS status query took (connect to the last byte)"
)
COMM_RANKS = MetricSpec("dgxdoctor_ras_communicator_ranks", "ranks of the largest NCCL communicator (vLLM's world)")
COMM_NODES = MetricSpec("dgxdoctor_ras_communicator_nodes", "nodes the largest NCCL communicator spans")
COMM_PER_NODE = MetricSpec(
    "dgxdoctor_ras_communicator_ranks_per_node",
    "ranks per node of the largest NCCL communicator: the fewest (bound=min) and the most (bound=max) on one node",
    labels=("bound",),
)
RANK_PROBLEM = MetricSpec(
    "dgxdoctor_ras_rank_problem_since_timestamp_seconds",
    "when this agent first saw NCCL's RAS report the process unresponsive, dead, erroring or behind (Unix time); "
    "rank is its rank in the largest communicator that names it, gpu its CUDA device, nvml_gpu its NVML index",
    labels=("kind", "rank", "host", "pid", "gpu", "nvml_gpu"),
)
LOCAL_RANK = MetricSpec(
    "dgxdoctor_ras_local_rank_info",
    "a rank of the largest NCCL communicator whose process runs on this node (from RAS's JSON report, NCCL 2.28.7+)",
    labels=("rank", "host", "pid", "gpu", "nvml_gpu"),
)

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})


class ReplyBytes(ByteCount):
    """A RAS reply's size cap: 4K .. 1G."""

    low = 4096
    high = 1 << 30


class RasSettings(CheckSettings, frozen=True):
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between RAS queries")] = 10.0
    timeout_s: Annotated[float, Meta(gt=0, le=DAY_S, description="a run that takes longer is UNKNOWN")] = 30.0
    address: Annotated[
        str,
        Meta(
            description="host:port of NCCL's RAS client socket; empty: NCCL_RAS_ADDR from a running vLLM process's "
            "environment, else localhost:28028 (NCCL's default)"
        ),
    ] = ""
    collective_timeout_s: Annotated[
        int, Meta(ge=1, le=60, description="RAS's wait for other processes, per leg (ncclras -t; NCCL's default is 5)")
    ] = 5
    deadline_s: Annotated[
        float, Meta(gt=0, le=HOUR_S, description="the whole query's hard deadline, connect to last byte")
    ] = 15.0
    max_bytes: Annotated[
        ReplyBytes,
        Meta(description="a RAS reply larger than this many bytes (or a size: 4M) is refused"),
    ] = ReplyBytes(4 << 20)
    tensor_parallel_size: Annotated[
        int, Meta(ge=0, le=1024, description="vLLM's TP size; 0: read from vLLM's command line")
    ] = 0
    pipeline_parallel_size: Annotated[
        int, Meta(ge=0, le=1024, description="vLLM's PP size; 0: read from vLLM's command line")
    ] = 0
    required: Annotated[
        bool, Meta(description="RAS must answer even without a vLLM process (an NCCL job other than vLLM serves)")
    ] = False

    def __post_init__(self) -> None:
        if self.address:
            try:
                parse_ras_addr(self.address)
            except RasError as exc:
                raise ValueError(f"address: {exc}") from None


def parallel_size(argv: tuple[str, ...], long: str, short: str) -> int | None:
    """``--tensor-parallel-size 8`` / ``-tp=8`` in vLLM's command line."""
    for i, arg in enumerate(argv):
        for flag in (long, short):
            if arg == flag and i + 1 < len(argv) and _decimal(argv[i + 1]):
                return int(argv[i + 1])
            if arg.startswith(flag + "=") and _decimal(arg[len(flag) + 1 :]):
                return int(arg[len(flag) + 1 :])
    return None


def _decimal(text: str) -> bool:
    """ASCII digits int() reads ("²".isdigit() is true, and int() refuses it)."""
    return text.isascii() and text.isdigit() and len(text) <= 9


def _same_address(a: tuple[str, int], b: tuple[str, int]) -> bool:
    return a[1] == b[1] and (a[0] == b[0] or (a[0] in LOOPBACK and b[0] in LOOPBACK))


class RasCheck(Check[RasSettings]):
    name: ClassVar[str] = "ras"
    probes: ClassVar[tuple[str, ...]] = ("ras",)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self._since: dict[str, float] = {}
        self._local: dict[int, bool] = {}
        # The local ranks of the last report: still exported while this node's RAS is silent (its port is held by
        # the stopped process), so the peer comparison knows which node that process is on.
        self._last_local: list[dict[str, str]] = []

    def _vllm(self) -> ProcessInfo | None:
        """The vLLM process whose environment names the RAS address and whose argv the rank count: one of root,
        dgxdoctor's user or ``[node] serving_user`` (another user's ``python -m vllm... -tp 8`` with its own
        ``NCCL_RAS_ADDR`` would point this check at a RAS server of its making)."""
        me, serving_uid = os.getpid(), self.env.serving_uid
        found = [
            p
            for p in iter_processes(self.env.proc_root)
            if p.pid != me and is_vllm_process(p.cmdline) and trusted_process(p.uid, None, serving_uid)
        ]
        return min(found, key=lambda p: p.pid, default=None)

    def _address(self, proc: ProcessInfo | None) -> tuple[tuple[str, int], str]:
        if self.settings.address:
            return parse_ras_addr(self.settings.address), "configured"
        if proc is not None:
            try:
                value = parse_environ(proc.environ()).get("NCCL_RAS_ADDR", "")
            except OSError:
                value = ""
            if value:
                return parse_ras_addr(value), f"NCCL_RAS_ADDR of pid {proc.pid}"
        return (DEFAULT_HOST, DEFAULT_PORT), "NCCL's default"

    def _expected_ranks(self, proc: ProcessInfo | None) -> int:
        argv = proc.cmdline if proc is not None else ()
        tp = self.settings.tensor_parallel_size or parallel_size(argv, "--tensor-parallel-size", "-tp") or 0
        pp = self.settings.pipeline_parallel_size or parallel_size(argv, "--pipeline-parallel-size", "-pp") or 1
        return tp * pp

    def _is_local(self, pid: int, addr: tuple[str, int]) -> bool:
        """Its process runs here and reads RAS where this agent does (NCCL_RAS_ADDR, or the default)."""
        if pid in self._local:
            return self._local[pid]
        info = read_process(self.env.proc_root, pid)
        local = False
        if info is not None and info.cmdline and info.alive:
            try:
                value = parse_environ(info.environ()).get("NCCL_RAS_ADDR", "")
                theirs = parse_ras_addr(value) if value else (DEFAULT_HOST, DEFAULT_PORT)
                local = _same_address(theirs, addr)
            except PermissionError:
                local = True  # running here; whose address it reads cannot be told without root
            except (OSError, RasError):
                local = False
        self._local[pid] = local
        return local

    def run(self) -> CheckResult:
        b = ResultBuilder(self.name)
        proc = self._vllm()
        addr, why = self._address(proc)
        where = f"{addr[0]}:{addr[1]} ({why})"
        try:
            s = self.settings
            reply = query(
                *addr, collective_timeout_s=s.collective_timeout_s, deadline_s=s.deadline_s, max_bytes=s.max_bytes
            )
        except RasError as exc:
            # vLLM on one GPU (or on CPUs) opens no NCCL communicator, so there is no RAS to miss.
            serving = proc is not None and self._expected_ranks(proc) > 1
            return self._no_answer(b, exc, where, serving=serving or self.settings.required)
        b.sample(RAS_UP, 1.0)
        b.sample(RAS_SECONDS, reply.seconds)
        try:
            report = parse_report(reply.report)
        except RasReportError as exc:
            b.add(Finding("RAS_REPORT_UNREADABLE", Status.UNKNOWN, f"RAS at {where} sent no readable report: {exc}",
                          subject="ras"))  # fmt: skip
            return b.build(f"RAS at {where}: unreadable report")
        return self._judge(b, report, reply, addr, proc)

    def _no_answer(self, b: ResultBuilder, exc: RasError, where: str, serving: bool) -> CheckResult:
        self._local.clear()
        finding = unreachable_finding(exc.kind, f"{where}: {exc}", serving)
        if finding is None:
            return CheckResult.skipped(
                self.name, f"no vLLM process across several GPUs, and no RAS at {where} ({exc.kind})"
            )
        if exc.kind == "timeout":
            b.timed_out("ras")
            for labels in self._last_local:
                b.sample(LOCAL_RANK, 1.0, **labels)
        else:
            self._last_local = []
        b.sample(RAS_UP, 0.0)
        b.add(finding)
        return b.build(f"RAS at {where} does not answer ({exc.kind})")

    def _judge(
        self, b: ResultBuilder, report: RasReport, reply: RasReply, addr: tuple[str, int], proc: ProcessInfo | None
    ) -> CheckResult:
        now = time.time()
        procs = stuck_processes(report)
        self._since = {p.key: self._since.get(p.key, now) for p in procs}
        b.add(*rank_findings(report, self._since))
        b.add(*layout_findings(report, self._expected_ranks(proc)))
        for p in procs:
            b.sample(RANK_PROBLEM, self._since[p.key], kind=p.kind, rank=str(p.ranks[0]) if p.ranks else "",
                     host=p.host or "", pid=str(p.pid or ""), gpu=_opt(p.gpu), nvml_gpu=_opt(p.nvml_gpu))  # fmt: skip
        serving = report.serving()
        if serving is not None:
            self._export_serving(b, serving.size, serving.nodes, serving.ranks_per_node)
            local = [{"rank": str(r.rank), "host": r.host, "pid": str(r.pid), "gpu": str(r.cuda_dev),
                      "nvml_gpu": str(r.nvml_dev)} for r in serving.ranks if self._is_local(r.pid, addr)]  # fmt: skip
            # a local rank that stopped is missing from the report's ranks: it stays listed while RAS names it
            named = {(p.host, str(p.pid)) for p in procs}
            kept = [x for x in self._last_local if (x["host"], x["pid"]) in named and x not in local]
            self._last_local = local + kept
            for labels in self._last_local:
                b.sample(LOCAL_RANK, 1.0, **labels)
        layout = f"{serving.size} ranks over {serving.nodes} node(s)" if serving else "no communicator"
        return b.build(
            f"RAS ({report.nccl_version or 'NCCL ?'}, {reply.format}): {layout}; "
            f"{len(procs)} process(es) reported, {report.timeouts} timeout(s)"
        )

    @staticmethod
    def _export_serving(b: ResultBuilder, size: int, nodes: int, per_node: tuple[int, int]) -> None:
        b.sample(COMM_RANKS, float(size))
        b.sample(COMM_NODES, float(nodes))
        b.sample(COMM_PER_NODE, float(per_node[0]), bound="min")
        b.sample(COMM_PER_NODE, float(per_node[1]), bound="max")
        spread = str(per_node[0]) if per_node[0] == per_node[1] else f"{per_node[0]}-{per_node[1]}"
        b.facts.update({"ras.communicator_size": str(size), "ras.communicator_nodes": str(nodes),
                        "ras.ranks_per_node": spread})  # fmt: skip


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)

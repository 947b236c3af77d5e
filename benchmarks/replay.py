"""Replay: how often remediation acts wrongly, and how often it misses (issue 39, first slice).

Two nodes (head and worker) of one tensor-parallel replica live through simulated days at accelerated time. Each
node has the real remediation engine (``remediation/engine.py`` ``Remediator`` with its guard, policy and hardware
gate) in act mode on a fake clock, its actions run by a stand-in command runner that records each argv (no real
``systemctl``) and its pages recorded by a stand-in pager. What it decides on are check results built by the real
checks' judge functions from realistic inputs (the fixtures of tests/fixtures): vLLM's ``/metrics`` window and the
progress verdict (``checks/vllm_window.py``, ``judge/vllm.py``), the down verdicts (``judge.vllm.not_up``), Ray's
node and GPU verdicts on the dashboard's captured answers, the real logs check following a log file into which
healthy serving logs (tests/fixtures/corpus/healthy) and the faults' lines are written, the real xid check on
kernel log lines, the infiniband port and counter verdicts, NCCL RAS's rank verdict on captured ``ncclras``
reports, the real vllm_executor check on a /proc tree, and the head's real peer_compare check reading the
worker's results document over HTTP through the real validation.

Fed with benign life (load changing between idle, bursts with preemptions and long prefills; one slow /health; a
transient Ray pending demand; IB counters' normal drift; the peer agent restarted; the operator's own restart of
vLLM; clock steps) and with the fault catalogue injected at seeded random times on either node, it prints: false
automatic actions per 1,000 node-days (an action with no injected fault behind it, or a restart while a fault a
restart cannot cure is active), recall per fault class (the promised action or page within its promised time), the
time from fault to action per class, and PASS/FAIL against the issue's targets.

    .venv/bin/python benchmarks/replay.py            # 200 days (Ray) + 25 days (mp) x 2 nodes, 20 faults a class
    .venv/bin/python benchmarks/replay.py --days 40 --mp-days 10 --faults 3 --seed 7 --json
    .venv/bin/python benchmarks/replay.py --set hold_s=0      # the same life at other [remediation] settings

Not covered yet (docs/remediation.md): agents in namespaced nodes with real processes, Prometheus and
Alertmanager in the loop (the webhook's alerts), and the real cost of each action on a real vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from msgspec.structs import replace

from dgxdoctor import eventlog
from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.checks.vllm import VLLM_PROCESS_UPTIME, VllmSettings
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck, VllmExecutorSettings
from dgxdoctor.checks.vllm_window import MetricsWindow
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.config import RemediationSettings
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.judge import infiniband as ib
from dgxdoctor.judge.consequence import judged_result
from dgxdoctor.judge.ras import rank_findings
from dgxdoctor.judge.ray import cluster_findings, raylet_down
from dgxdoctor.judge.vllm import Limits, Server, not_up, pressure_findings
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.result import CheckResult, ResultBuilder
from dgxdoctor.sources.commands import CommandResult
from dgxdoctor.sources.ras_report import parse_report
from dgxdoctor.sources.ray_api import ClusterView, cluster_view, parse_cluster_status, parse_nodes_detail
from dgxdoctor.sources.sysfs_ib import IbPort
from dgxdoctor.sources.vllm_api import Health
from dgxdoctor.sources.vllm_metrics import VllmMetrics, parse_vllm_metrics
from dgxdoctor.validation import validate

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(REPO / "tests"))
import replay_figures as figures  # noqa: E402  (beside this file)

from proctree import write_process  # type: ignore[import-not-found]  # noqa: E402  (the /proc tree stand-in the suite uses)

DAY_S = 86_400.0
TICK_S = 5.0  # the simulation's step: each check runs at its own interval on this grid, remediation every step
QUIET_STEP_S = 60.0  # the step through quiet stretches (Sim._quiet)
LOG_EVERY_S = 300.0  # healthy serving log lines are written in batches this often
PEER_REFRESH_S = 600.0  # the peer comparison is run afresh at least this often (else when a document changed)
T0 = 1_800_000_000.0
HEAD, WORKER = "dgx-a", "dgx-b"
WORKER_URL = "http://dgx-b:9835"
TOKEN = "replay-token-0123456789abcdef"
URL = "http://127.0.0.1:8000"
# the checks' default interval_s
INTERVALS = {"vllm": 15.0, "ray": 30.0, "logs": 10.0, "xid": 10.0, "infiniband": 30.0, "ras": 10.0,
             "peer_compare": 15.0, "vllm_executor": 30.0}  # fmt: skip
LOAD_S = (120.0, 420.0)  # how long a (re)started vLLM takes to load and answer, drawn per start
XID_LINES = {
    79: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.",
    74: "NVRM: Xid (PCI:0000:D8:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14"
    "(0x100000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    # NVIDIA's wording of XID 48 (no captured line in tests/fixtures/kernel_log)
    48: "NVRM: Xid (PCI:0000:3b:00): 48, pid=2234, name=python3, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 0, subpartition 0.",
}
HEADLESS = ("/usr/bin/python3", "/opt/vllm/bin/vllm", "serve", "/models/m", "--tensor-parallel-size", "16",
            "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501",
            "--headless")  # fmt: skip


# ---- the fault catalogue --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultClass:
    """A fault class the docs promise an answer for. ``expect``: the action (on the head) or ``page``; ``deadline_s``:
    its promised time from the fault, the detecting check's interval (and ``stall_s`` for a stall) plus ``hold_s``
    (30 s) plus one minute; ``curable``: a restart can cure it (else any restart while it lasts is a false action)."""

    name: str
    expect: str
    deadline_s: float
    curable: bool
    nodes: tuple[str, ...]
    deployment: str  # "ray" (Ray executor) or "mp" (vLLM's multiprocessing executor across nodes)


CATALOGUE = (
    FaultClass("vllm_dead", "restart_vllm", 15 + 30 + 60, True, (HEAD,), "ray"),
    FaultClass("api_hung", "restart_vllm", 15 + 5 + 30 + 60, True, (HEAD,), "ray"),
    FaultClass("engine_stalled", "restart_vllm", 15 + 15 + 30 + 60, True, (HEAD, WORKER), "ray"),
    FaultClass("ray_node_lost", "restart_cluster", 30 + 30 + 60, True, (HEAD, WORKER), "ray"),
    FaultClass("gpus_missing", "restart_cluster", 30 + 30 + 60, True, (WORKER,), "ray"),
    FaultClass("nccl_timeout", "restart_cluster", 10 + 30 + 60, True, (HEAD, WORKER), "ray"),
    FaultClass("mp_worker_down", "restart_cluster", 30 + 15 + 30 + 60, True, (WORKER,), "mp"),
    FaultClass("xid79", "page", 10 + 30 + 60, False, (HEAD, WORKER), "ray"),
    FaultClass("xid74", "page", 10 + 30 + 60, False, (HEAD, WORKER), "ray"),
    FaultClass("xid48", "page", 10 + 30 + 60, False, (HEAD, WORKER), "ray"),
    FaultClass("ib_port_down", "page", 30 + 30 + 60, False, (HEAD, WORKER), "ray"),
    FaultClass("ras_dead_rank", "restart_vllm", 15 + 15 + 30 + 60, True, (HEAD, WORKER), "ray"),
)
BY_NAME = {c.name: c for c in CATALOGUE}
RESIDUAL_S = 600.0  # after a hardware fix, the person restarts vLLM this much later if remediation has not
HARDWARE_FIX_S = 3600.0  # a person fixes a hardware fault (reset, reboot, cable) after this, then restarts vLLM
UNANSWERED_S = 3600.0  # a curable fault nobody cured ends by a person's hand after this (a miss)


@dataclass
class Fault:
    cls: FaultClass
    node: str
    start: float
    end: float
    cured_at: float | None = None
    answered_at: float | None = None  # the promised action or page
    answer: str = ""


# ---- what each node's checks see -------------------------------------------------------------------------------


def _ray_views() -> dict[str, ClusterView]:
    ray = FIXTURES / "ray"

    def view(nodes: str, status: str) -> ClusterView:
        detail = parse_nodes_detail((ray / f"{nodes}-nodes-detail.json").read_bytes())
        return cluster_view(detail, parse_cluster_status((ray / f"{status}-cluster-status.json").read_bytes()))

    healthy = view("healthy", "healthy")
    half = tuple(replace(n, gpus=4.0) if not n.is_head else n for n in healthy.nodes)  # a worker lost 4 GPUs
    status = parse_cluster_status((ray / "healthy-cluster-status.json").read_bytes())
    return {"healthy": healthy, "pending": view("healthy", "pending"), "dead": view("dead", "dead"),
            "gpus_missing": cluster_view(half, status)}  # fmt: skip


RAY_VIEWS = _ray_views()
RAS_HEALTHY = parse_report((FIXTURES / "ras" / "healthy_2x8.txt").read_text())
RAS_DEAD = parse_report((FIXTURES / "ras" / "dead_rank11.txt").read_text())
HEALTHY_LOG_LINES = [
    line
    for path in sorted((FIXTURES / "corpus" / "healthy").iterdir())
    for line in path.read_text(errors="replace").splitlines()
    if line.strip()
]
NCCL_TIMEOUT_LINES = (FIXTURES / "logs" / "nccl_timeout.log").read_text().splitlines()
NCCL_NET_LINES = (FIXTURES / "logs" / "nccl_net_failure.log").read_text().splitlines()
IDLE_METRICS = parse_vllm_metrics((FIXTURES / "vllm" / "metrics-0.32.0-idle.txt").read_text())


class Load:
    """vLLM's load over time: a seeded schedule of idle stretches, steady serving, bursts (a queue, preemptions,
    the KV cache full) and long prefills (an engine step only every several seconds, below ``stall_s``)."""

    def __init__(self, rng: random.Random, start: float, end: float) -> None:
        self.segments: list[tuple[float, str]] = []
        t = start
        while t < end:
            kind = rng.choices(["idle", "steady", "burst", "prefill"], [4, 8, 2, 1])[0]
            self.segments.append((t, kind))
            t += rng.uniform(60, 1800) if kind in ("idle", "steady") else rng.uniform(30, 600)
        self.times = [s for s, _ in self.segments]
        self.i = 0

    def next_change(self, t: float) -> float:
        self.at(t)
        return self.segments[self.i + 1][0] if self.i + 1 < len(self.segments) else math.inf

    def started(self, t: float) -> float:
        self.at(t)
        return self.segments[self.i][0]

    def at(self, t: float) -> str:
        while self.i + 1 < len(self.segments) and self.segments[self.i + 1][0] <= t:
            self.i += 1
        return self.segments[self.i][1]


@dataclass
class Counters:
    steps: float = 0.0
    gen: float = 0.0
    prompt: float = 0.0
    finished: float = 0.0
    preempt: float = 0.0
    next_prefill_step: float = 0.0


def metrics_of(load: str, c: Counters, t: float, rng: random.Random, stalled: bool) -> VllmMetrics:
    """One ``/metrics`` reading: the engine's counters move while it works (never while ``stalled``)."""
    running, waiting, kv = {"idle": (0, 0, 0.0), "steady": (12, 0, 0.45), "burst": (64, 25, 0.97),
                            "prefill": (2, 1, 0.3)}[load]  # fmt: skip
    if running and not stalled:
        if load == "prefill":  # one long chunk of prefill at a time: a step every 4-11 s
            if t >= c.next_prefill_step:
                c.steps += 1
                c.prompt += 8192
                c.next_prefill_step = t + rng.uniform(4.0, 11.0)
        else:
            n = rng.randint(20, 200)
            c.steps += n
            c.gen += n * running * 0.9
            c.prompt += rng.randint(0, 4000)
            c.finished += rng.randint(0, running)
            if load == "burst" and rng.random() < 0.5:
                c.preempt += rng.randint(1, 6)
    return replace(IDLE_METRICS, num_requests_running=float(running), num_requests_waiting=float(waiting),
                   kv_cache_usage=kv, engine_steps_total=c.steps, generation_tokens_total=c.gen,
                   prompt_tokens_total=c.prompt, requests_finished_total=c.finished, preemptions_total=c.preempt,
                   ttft=None, itl=None)  # fmt: skip


def built(builder: ResultBuilder, summary: str, started_at: float) -> CheckResult:
    """As the check runner stores a result: what follows from each finding (judge.consequence) and its start."""
    return replace(judged_result(builder.build(summary)), started_at=started_at)


# ---- a node ----------------------------------------------------------------------------------------------------


class Recorder:
    """The stand-in actuators: every argv the engine runs, every step a head asks of a worker, every page."""

    def __init__(self) -> None:
        self.argv: list[tuple[float, str, tuple[str, ...]]] = []
        self.pages: list[tuple[float, str, str, str]] = []


class Node:
    def __init__(self, sim: Sim, name: str, role: str, root: Path) -> None:
        self.sim, self.name, self.role = sim, name, role
        self.offset = 0.0  # the node's wall clock minus true time (a clock step moves it)
        self.root = root
        self.results: dict[str, CheckResult] = {}
        self.last_run: dict[str, float] = {}
        self.log = root / "vllm.log"
        self.log.write_text("")
        self.log_cursor = sim.rng.randrange(len(HEALTHY_LOG_LINES))
        settings = validate(LogsSettings, {"vllm_paths": [str(self.log)], "ray_paths": [], "journal_units": []})
        env = Environment(node=name, clock=self.clock, one_shot=False, state_dir=root / "logs-state")
        (root / "logs-state").mkdir()
        self.logs = LogsCheck(settings, env)
        self.logs_dirty = True
        self.ib_counters: list[dict[str, int]] = [
            {"symbol_error": 0, "port_rcv_errors": 0, "link_error_recovery": 0, "port_xmit_discards": 0,
             "local_ack_timeout_err": 0, "link_downed": 0} for _ in range(8)]  # fmt: skip
        self.ib_prev: tuple[float, list[dict[str, int]]] | None = None
        self.agent_down_until = -math.inf  # the agent restarted: its /state gives nothing meanwhile
        self.xid_cache: dict[tuple[str, ...], CheckResult] = {}  # the xid check's result per kernel log
        self.peer_key: object = None  # what the last peer comparison compared (Sim._run_checks)
        self.peer_at = -math.inf
        self.remediator = self._remediator()

    def clock(self) -> float:
        return self.sim.now + self.offset

    def _remediator(self) -> Remediator:
        sim = self.sim
        state = self.root / "remediation"
        state.mkdir()
        settings = validate(RemediationSettings, {"mode": "act", "role": self.role, **sim.settings})
        executor = "mp" if sim.deployment == "mp" else None
        workers = (WORKER_URL,) if self.role == "head" else ()
        targets = Targets(VllmTarget(URL, "m"), "http://127.0.0.1:8265", 2, 16, workers, TOKEN, executor)
        env = Environment(node=self.name, http_transport=httpx.MockTransport(self._services),
                          run_command=self._run, role=self.role, executor=executor)  # type: ignore[arg-type]  # fmt: skip

        def pager(node: str, problem: str, suggested: str, reason: str, now: float) -> str:
            sim.on_page(self, problem, suggested, reason)
            return "recorded"

        r = Remediator(settings, pager, self.name, state, targets, lambda: self.results, clock=self.clock, env=env)
        r.capture = None
        return r

    def _run(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        self.sim.on_command(self, tuple(argv))
        return CommandResult(tuple(argv), 0, "", "")

    def _services(self, request: httpx.Request) -> httpx.Response:
        """vLLM, Ray's dashboard and the worker's step API as the action's verification and steps see them."""
        path = request.url.path
        if path == "/remediation/step":
            step = json.loads(request.content)["step"]
            self.sim.on_command(self.sim.worker, ("step", step))
            return httpx.Response(200, json={"ok": True, "detail": "done"})
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
        if path == "/api/v0/nodes":
            return httpx.Response(200, content=(FIXTURES / "ray" / "healthy-nodes-detail.json").read_bytes())
        return httpx.Response(404)

    def due(self, check: str) -> bool:
        last = self.last_run.get(check)
        return last is None or self.sim.now - last >= INTERVALS[check] - 1e-6

    def store(self, result: CheckResult) -> None:
        self.results[result.check] = result
        self.last_run[result.check] = self.sim.now


class Sim:
    """One cluster (head and worker) through ``days`` of simulated time with ``faults`` injected."""

    def __init__(self, seed: int, days: float, faults_per_class: int, deployment: str, settings: dict[str, Any],
                 root: Path, gap_s: float = 4 * 3600) -> None:  # fmt: skip
        self.rng = random.Random(seed)
        self.gap_s = gap_s
        self.deployment = deployment
        self.settings = settings
        self.start, self.end = T0, T0 + days * DAY_S
        self.now = self.start
        self.vllm_settings = VllmSettings()
        vs = self.vllm_settings
        self.limits = Limits(vs.request_timeout_s, vs.startup_grace_s, vs.busy_cpu_ratio, vs.kv_cache_warn,
                             vs.stall_s, vs.latency_min_requests, vs.ttft_p99_jump_factor, vs.ttft_p99_max_s,
                             vs.itl_p99_max_s)  # fmt: skip
        self.head = Node(self, HEAD, "head", _mkdir(root / "head"))
        self.worker = Node(self, WORKER, "worker", _mkdir(root / "worker"))
        self.nodes = (self.head, self.worker)
        self.load = Load(self.rng, self.start, self.end)
        self.window = MetricsWindow(vs.latency_window_s, vs.kv_cache_sustained_s, one_shot=False)
        self.counters = Counters()
        self.vllm_started = self.start - 3 * DAY_S  # vLLM has served for days when the replay begins
        self.vllm_ready = self.start - 3 * DAY_S + 300
        self.vllm_gone_until = -math.inf  # the operator's restart: no process for a few seconds
        self.faults = self._schedule_faults(faults_per_class)
        self.benign = self._schedule_benign(days)
        self.actions: list[dict[str, Any]] = []  # each action run: when, node, action, what stood behind it
        self.pages: list[dict[str, Any]] = []
        self.residual: tuple[Fault, float] | None = None
        self.peer_check = self._peer_check()
        self.commands: list[tuple[float, str, tuple[str, ...]]] = []
        self.slow_health_run = False
        self.ray_pending_until = -math.inf
        self.recent_benign: list[tuple[float, str, str]] = []
        self.started_action: str | None = None
        self.acted_on = ""
        self.executor_proc = self.worker.root / "proc"
        self._headless(True)

    # -- schedules ------------------------------------------------------------------------------------------

    def _schedule_faults(self, per_class: int) -> list[Fault]:
        """``per_class`` faults of each class of this deployment at seeded random times, at least ``gap_s`` apart
        (beyond the ladder's window and every restart cooldown: each fault is judged on its own), each on a seeded
        node of those its class names."""
        classes = [c for c in CATALOGUE if c.deployment == self.deployment]
        n = per_class * len(classes)
        room = self.end - self.start - 2 * 3600
        if n and room / n < self.gap_s:
            raise ValueError(f"{n} faults {self.gap_s:g} s apart need {(n * self.gap_s + 7200) / DAY_S:.1f} "
                             f"simulated days in deployment {self.deployment!r}")  # fmt: skip
        order = [c for c in classes for _ in range(per_class)]
        self.rng.shuffle(order)
        slot = room / max(n, 1)
        faults = []
        for i, cls in enumerate(order):
            start = self.start + 2 * 3600 + i * slot + self.rng.uniform(0, slot - self.gap_s)
            end = start + (HARDWARE_FIX_S if not cls.curable else UNANSWERED_S)
            faults.append(Fault(cls, self.rng.choice(cls.nodes), start, end))
        return faults

    def _schedule_benign(self, days: float) -> list[tuple[float, str, str]]:
        """(when, node, event): per simulated day one slow /health, one transient Ray pending demand, one restart
        of the peer's agent; every other day the operator's own restart of vLLM; every third day a clock step."""
        events = []
        for d in range(math.ceil(days)):
            base = self.start + d * DAY_S
            pick = self.rng.uniform
            events += [(base + pick(0, DAY_S), HEAD, "slow_health"), (base + pick(0, DAY_S), HEAD, "ray_pending"),
                       (base + pick(0, DAY_S), self.rng.choice([HEAD, WORKER]), "agent_restart")]  # fmt: skip
            if d % 2 == 0:
                events.append((base + pick(0, DAY_S), HEAD, "planned_restart"))
            if d % 3 == 0:
                events.append((base + pick(0, DAY_S), self.rng.choice([HEAD, WORKER]), "clock_step"))
        return sorted(e for e in events if e[0] < self.end)

    # -- the world ------------------------------------------------------------------------------------------

    def active(self, name: str, node: str | None = None) -> Fault | None:
        for f in self.faults:
            if f.cls.name == name and f.start <= self.now < f.end and f.cured_at is None and node in (None, f.node):
                return f
        return None

    def any_active(self, names: Sequence[str]) -> bool:
        if self.residual is not None and self.residual[0].cls.name in names:
            return True  # what a fixed hardware fault left behind: vLLM down, its engine hung
        return any(self.active(n) for n in names)

    def _headless(self, running: bool) -> None:
        shutil.rmtree(self.executor_proc, ignore_errors=True)
        self.executor_proc.mkdir()
        if running:
            write_process(self.executor_proc, 4242, "vllm", HEADLESS)

    def vllm_result(self) -> CheckResult:
        """The head's vllm check: the down verdicts, or the ``/metrics`` window's (the progress verdict)."""
        t, node, limits = self.now, self.head, self.limits
        b = ResultBuilder("vllm")
        hardware = self.any_active(("xid79", "xid74", "xid48"))
        dead = self.any_active(("vllm_dead",)) or hardware or t < self.vllm_gone_until
        uptime = None if dead else t - self.vllm_started
        process = None if dead else "process 4100 (/usr/bin/python3 -m vllm.entrypoints.openai.api_server)"
        idle_api = self.any_active(("api_hung",)) or self.slow_health_run  # the API server's CPU while /health waits
        server = Server(URL, process, "no vLLM process" if dead else None, uptime, True, 0.02 if idle_api else 0.9,
                        "S", head=True)  # fmt: skip
        health = None
        if dead or t < self.vllm_ready:
            health = Health("refused", "[Errno 111] Connection refused")
        elif self.any_active(("api_hung",)) or self.slow_health_run:
            health = Health("timeout", "timed out")
        if health is not None:
            self.window.reset()
            down = not_up(health, server, limits)
            b.add(*down.findings)
            summary = down.summary
        else:
            seen = self.window.observed(limits.kv_cache_warn, self.vllm_settings.waiting_sustained_s)
            b.add(*pressure_findings(seen, limits, URL))
            summary = "serving"
        if uptime is not None:
            b.sample(VLLM_PROCESS_UPTIME, uptime)
        self.slow_health_run = False
        return built(b, summary, node.clock())

    def stalled(self) -> bool:
        return self.any_active(("engine_stalled", "ras_dead_rank", "mp_worker_down", "ib_port_down"))

    def read_metrics(self) -> None:
        """The follower's reading (every step while vLLM serves); a stall crossing ``stall_s`` asks for a run."""
        if self.now < self.vllm_ready or self.any_active(("vllm_dead", "api_hung", "xid79", "xid74", "xid48")):
            return
        load = self.load.at(self.now)
        if self.stalled() and load == "idle":
            load = "steady"  # a stuck collective shows when requests come: with none, nothing can stall
        m = metrics_of(load, self.counters, self.now, self.rng, self.stalled())
        before = self.window.progress.stalled_s() or 0.0
        self.window.observe(m, self.now)
        after = self.window.progress.stalled_s() or 0.0
        if m.has_load and before < self.limits.stall_s <= after:
            self.head.last_run.pop("vllm", None)  # the follower asks for a run of the check now

    def ray_result(self, node: Node) -> CheckResult:
        b = ResultBuilder("ray")
        lost = self.active("ray_node_lost")
        if lost is not None and lost.node == HEAD:
            if node is self.head:
                b.add(raylet_down())
            else:
                return replace(CheckResult.unknown("ray", "Ray dashboard http://10.77.0.1:8265 unreachable"),
                               started_at=node.clock())  # fmt: skip
            return built(b, "raylet down", node.clock())
        if lost is not None:
            view = RAY_VIEWS["dead"]
        elif self.active("gpus_missing"):
            view = RAY_VIEWS["gpus_missing"]
        elif self.ray_pending_until > self.now:
            view = RAY_VIEWS["pending"]
        else:
            view = RAY_VIEWS["healthy"]
        b.add(*cluster_findings(view, 2, 16))
        return built(b, "ray", node.clock())

    def xid_result(self, node: Node) -> CheckResult:
        lines = [XID_LINES[int(n[3:])] for n in ("xid79", "xid74", "xid48") if self.active(n, node.name)]
        key = tuple(lines)
        cached = node.xid_cache
        if key not in cached:
            kmsg = node.root / "kmsg"
            kmsg.write_text("".join(f"{line}\n" for line in lines))
            cached[key] = judged_result(XidCheck(XidSettings(), Environment(node=node.name, kmsg_path=kmsg)).run())
        return replace(cached[key], started_at=node.clock())

    def ib_result(self, node: Node) -> CheckResult:
        """Eight NDR ports; counters drift as they do on a healthy fabric; a port down during ``ib_port_down``."""
        b = ResultBuilder("infiniband")
        down = self.active("ib_port_down", node.name)
        now = node.clock()
        for i, counters in enumerate(node.ib_counters):
            r = self.rng.random()
            counters["symbol_error"] += r < 1 / 30
            counters["port_rcv_errors"] += r < 1 / 60
            counters["link_error_recovery"] += r < 1 / 500
            counters["port_xmit_discards"] += int(r * 40)
            port = IbPort(f"mlx5_{i}", 1, "Down" if down and i == 3 else "Active",
                          "Polling" if down and i == 3 else "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand",
                          counters=dict(counters))  # fmt: skip
            verdict = ib.port_state_verdict(port)
            if verdict is not None:
                b.add(verdict.finding(port.name))
            if node.ib_prev is not None:
                prev_t, prev = node.ib_prev
                # counters that did not move are left out: with no checkpoints, no rule can breach on them
                deltas = {k: v - prev[i][k] for k, v in counters.items() if v != prev[i][k]}
                for finding, _ in ib.counter_verdicts(port.name, ib.DEFAULT_THRESHOLDS, counters, deltas,
                                                      (prev_t, prev[i]), [], now):  # fmt: skip
                    b.add(finding)
        node.ib_prev = (now, [dict(c) for c in node.ib_counters])
        return built(b, "infiniband", now)

    def ras_result(self, node: Node) -> CheckResult:
        b = ResultBuilder("ras")
        dead = self.active("ras_dead_rank", node.name)
        b.add(*rank_findings(RAS_DEAD if dead else RAS_HEALTHY))
        return built(b, "ras", node.clock())

    def executor_result(self) -> CheckResult:
        env = Environment(node=WORKER, role="worker", executor="mp", proc_root=self.executor_proc)
        return replace(judged_result(VllmExecutorCheck(VllmExecutorSettings(), env).run()),
                       started_at=self.worker.clock())  # fmt: skip

    def _peer_check(self) -> PeerCompareCheck:
        """The head's peer_compare check, one instance for the whole run as the daemon keeps it; the worker's
        ``/state`` is its results document, served over HTTP (refused while its agent restarts)."""

        def serve(request: httpx.Request) -> httpx.Response:
            worker = self.worker
            if self.now < worker.agent_down_until:
                raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
            doc = ResultsDocument.of(WORKER, list(worker.results.values()), worker.clock()).state()
            return httpx.Response(200, content=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})

        def local(without: str | None) -> dict[str, Any]:
            results = [r for r in self.head.results.values() if r.check != without]
            return ResultsDocument.of(HEAD, results, self.head.clock()).state()

        fleet = Fleet(local_state=local, peers=lambda: Peers((WORKER_URL,), TOKEN, 5.0))
        env = Environment(node=HEAD, http_transport=httpx.MockTransport(serve), one_shot=False, fleet=fleet,
                          clock=self.head.clock)  # fmt: skip
        return PeerCompareCheck(validate(PeerCompareSettings, {}), env)

    def peer_result(self) -> CheckResult:
        """The head's peer_compare check: the worker's /state fetched over HTTP, validated, compared."""
        return replace(judged_result(self.peer_check.run()), started_at=self.head.clock())

    def write_logs(self, node: Node, lines: Sequence[str]) -> None:
        with node.log.open("a") as f:
            f.write("".join(f"{line}\n" for line in lines))
        node.logs_dirty = True

    # -- events ---------------------------------------------------------------------------------------------

    def on_command(self, node: Node, argv: tuple[str, ...]) -> None:
        self.commands.append((self.now, node.name, argv))

    def on_page(self, node: Node, problem: str, suggested: str, reason: str) -> None:
        behind = [f.cls.name for f in self._open_faults()] or ([self.residual[0].cls.name] if self.residual else [])
        self.pages.append({"t": self.now, "node": node.name, "problem": problem, "reason": reason, "faults": behind})
        for f in self._open_faults():
            if not f.cls.curable and f.answered_at is None:
                f.answered_at, f.answer = self.now, "page"

    def _open_faults(self) -> list[Fault]:
        return [f for f in self.faults if f.start <= self.now < f.end and f.cured_at is None]

    def on_action(self, node: Node, action: str) -> None:
        """An action the engine ran: judge what stood behind it, then let it act on the world."""
        open_ = self._open_faults()
        curable = [f for f in open_ if f.cls.curable]
        incurable = [f for f in open_ if not f.cls.curable]
        if incurable:
            verdict = "false: a restart while " + ", ".join(f"{f.cls.name} on {f.node}" for f in incurable)
        elif curable:
            verdict = "true"
        elif self.residual is not None:
            verdict = "true"  # vLLM left down by a hardware fault that is fixed now
            open_ = [self.residual[0]]
        else:
            verdict = "false: no fault behind it"
        self.residual = None
        self.actions.append({"t": self.now, "node": node.name, "action": action, "verdict": verdict,
                             "faults": [f.cls.name for f in open_], "benign": self._benign_near(),
                             "seen": self.acted_on, "load": self.load.at(self.now)})  # fmt: skip
        whole = action == "restart_cluster" or self.deployment == "mp"  # mp: either restart is the whole order
        for f in curable:
            # the promised restart, or the cluster restart the ladder climbs to (it restarts vLLM too)
            if f.answered_at is None and (whole or action in (f.cls.expect, "restart_cluster")):
                f.answered_at, f.answer = self.now, action
            if whole or f.cls.name in ("vllm_dead", "api_hung", "engine_stalled", "ras_dead_rank"):
                f.cured_at = self.now
                if f.cls.name == "mp_worker_down":
                    self._headless(True)
        self._vllm_restarted()

    def _benign_near(self) -> list[str]:
        return [f"{e} on {n} at +{self.now - t:.0f} s" for t, n, e in self.benign if 0 <= self.now - t < 1800]

    def _vllm_restarted(self) -> None:
        self.vllm_started = self.now
        self.vllm_ready = self.now + self.rng.uniform(*LOAD_S)
        self.window.reset()

    def on_decision(self, node: Node, record: dict[str, Any]) -> None:
        """A page the policy suggests (audited ``suggest``: the shipped alert rules page it) answers a page class;
        an action started is remembered by its name (applied to the world once it has run)."""
        if record.get("event") == "action_started":
            self.started_action = str(record["action"])
        if record.get("event") == "decision" and record.get("verdict") == "act":
            self.acted_on = str(record.get("seen", ""))
        if record.get("event") != "decision" or record.get("action") != "page":
            return
        if record.get("verdict") not in ("suggest", "page", "act"):
            return
        for f in self._open_faults():
            if not f.cls.curable and f.answered_at is None:
                f.answered_at, f.answer = self.now, f"suggest ({record['problem']})"

    def benign_event(self, node_name: str, event: str) -> None:
        node = self.head if node_name == HEAD else self.worker
        if event == "slow_health":
            self.slow_health_run = True  # the next run's /health times out (the API server idle meanwhile)
        elif event == "ray_pending":
            self.ray_pending_until = self.now + self.rng.uniform(20, 90)
        elif event == "agent_restart":
            node.agent_down_until = self.now + 60
        elif event == "planned_restart":
            self.vllm_gone_until = self.now + self.rng.uniform(2, 8)
            self._vllm_restarted()
            self.vllm_started = self.vllm_gone_until
            self.write_logs(self.head, HEALTHY_LOG_LINES[:40])
        elif event == "clock_step":
            node.offset += self.rng.choice([-90.0, -30.0, 45.0, 120.0])

    def fault_starts(self, f: Fault) -> None:
        name = f.cls.name
        if name == "nccl_timeout":
            self.write_logs(self.worker if f.node == WORKER else self.head, NCCL_TIMEOUT_LINES)
            if f.node == WORKER:  # Ray forwards its workers' lines to the driver: the head's vLLM log has them too
                self.write_logs(self.head, [f"(RayWorkerWrapper pid=4711, ip=10.77.0.2) {line}"
                                            for line in NCCL_TIMEOUT_LINES])  # fmt: skip
        elif name == "mp_worker_down":
            self._headless(False)

    def fault_follows(self, f: Fault) -> None:
        """What a fault brings 30 s later: a rail down makes NCCL fail over the network."""
        if f.cls.name == "ib_port_down":
            self.write_logs(self.head, NCCL_NET_LINES)

    def fault_ends(self, f: Fault) -> None:
        if not f.cls.curable:
            # The hardware is fixed; vLLM is still down (or its engine hung) until a restart: remediation's (the
            # docs: once the cause clears, restarts are decided as before) or the person's, RESIDUAL_S later.
            self.residual = (f, self.now + RESIDUAL_S)
        elif f.cured_at is None:
            self._vllm_restarted()  # the person who came for the missed fault restarts vLLM
        if f.cls.name == "mp_worker_down":
            self._headless(True)

    # -- the run --------------------------------------------------------------------------------------------

    def run(self) -> None:
        loop = asyncio.new_event_loop()  # the engine's; the checks run outside it, as the daemon's threads do
        for node in self.nodes:
            self._hook(node)
        benign = list(self.benign)
        pending = sorted(self.faults, key=lambda f: f.start)
        follows = sorted(pending, key=lambda f: f.start + 30)
        ending = sorted(pending, key=lambda f: f.end)
        last_lines = -math.inf
        while self.now < self.end:
            while benign and benign[0][0] <= self.now:
                self.recent_benign = [*self.recent_benign[-4:], benign[0]]
                _, n, e = benign.pop(0)
                self.benign_event(n, e)
            while pending and pending[0].start <= self.now:
                self.fault_starts(pending.pop(0))
            while follows and follows[0].start + 30 <= self.now:
                self.fault_follows(follows.pop(0))
            while ending and ending[0].end <= self.now:
                self.fault_ends(ending.pop(0))
            if self.residual is not None and self.residual[1] <= self.now:
                self.residual = None
                self._vllm_restarted()  # the person restarts vLLM after the fix
            if self.now - last_lines >= LOG_EVERY_S:  # healthy serving lines, written in batches
                self.write_logs(self.head, self._healthy_lines(self.head))
                last_lines = self.now
            self.read_metrics()
            self._run_checks()
            for node in self.nodes:
                loop.run_until_complete(self._evaluate(node))
            upcoming = min([benign[0][0] if benign else math.inf, pending[0].start if pending else math.inf,
                            self.load.next_change(self.now)])  # fmt: skip
            self.now += QUIET_STEP_S if self._quiet(upcoming) else TICK_S
        loop.close()

    def _quiet(self, upcoming: float) -> bool:
        """Nothing can change for a while: no fault open or recent, no benign event near, vLLM serving an idle or
        steady load for two minutes, both engines idle. Then the step is ``QUIET_STEP_S`` (each check still runs at
        most at its interval): what the checks see there is the same healthy picture, only less often."""
        now = self.now
        if upcoming - now < QUIET_STEP_S + TICK_S or now < self.vllm_ready + 120 or self.residual is not None:
            return False
        if any(f.start - 60 <= now < (f.cured_at or f.end) + 900 for f in self.faults):
            return False
        if any(0 <= now - t < 600 for t, _, _ in self.recent_benign):
            return False
        if self.load.at(now) not in ("idle", "steady") or now - self.load.started(now) < 120:
            return False
        return all(n.remediator.idle and n.agent_down_until < now for n in self.nodes)

    def _healthy_lines(self, node: Node) -> list[str]:
        n = self.rng.randint(0, 20)
        out = []
        for _ in range(n):
            out.append(HEALTHY_LOG_LINES[node.log_cursor % len(HEALTHY_LOG_LINES)])
            node.log_cursor += 1
        return out

    def _run_checks(self) -> None:
        head, worker = self.head, self.worker
        ray = self.deployment == "ray"
        if head.due("vllm"):
            head.store(self.vllm_result())
        for node in self.nodes:
            if ray and node.due("ray"):
                node.store(self.ray_result(node))
            if node.due("xid"):
                node.store(self.xid_result(node))
            if node.due("infiniband"):
                node.store(self.ib_result(node))
            if node.due("ras"):
                node.store(self.ras_result(node))
            if node.due("logs") and (node.logs_dirty or "logs" not in node.results
                                     or node.results["logs"].findings):  # fmt: skip
                node.store(replace(judged_result(node.logs.run()), started_at=node.clock()))
                node.logs_dirty = False
            elif node.due("logs"):
                node.store(replace(node.results["logs"], started_at=node.clock()))
        if not ray and worker.due("vllm_executor"):
            worker.store(self.executor_result())
        if head.due("peer_compare"):
            key = (_gist(head.results), _gist(worker.results), self.now < worker.agent_down_until)
            if key != head.peer_key or self.now - head.peer_at >= PEER_REFRESH_S:
                head.store(self.peer_result())
                head.peer_key, head.peer_at = key, self.now
            else:
                head.store(replace(head.results["peer_compare"], started_at=head.clock()))

    def _hook(self, node: Node) -> None:
        r = node.remediator
        record = r.audit_record

        def audited(doc: dict[str, Any]) -> bool:
            self.on_decision(node, doc)
            return record(doc)

        r.audit_record = audited  # type: ignore[method-assign,assignment]

    async def _evaluate(self, node: Node) -> None:
        r = node.remediator
        self.started_action = None
        await r.evaluate()
        if r.acting is not None:
            task, r.acting = r.acting, None
            await task
        if self.started_action is not None:
            self.on_action(node, self.started_action)


def _gist(results: dict[str, CheckResult]) -> tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...]:
    """What a results document says apart from its times: each check's status and findings (code, status)."""
    return tuple(sorted((r.check, r.status.value, tuple((f.code, f.status.value) for f in r.findings))
                        for k, r in results.items() if k != "peer_compare"))  # fmt: skip


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


# ---- figures ---------------------------------------------------------------------------------------------------


@dataclass
class Figures:
    node_days: float
    actions: list[dict[str, Any]]
    faults: list[Fault]
    pages: list[dict[str, Any]]
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def false_actions(self) -> list[dict[str, Any]]:
        return [a for a in self.actions if a["verdict"] != "true"]

    def per_class(self) -> dict[str, dict[str, Any]]:
        return figures.per_class(CATALOGUE, self.faults, self.actions, _missed)

    def verdicts(self) -> dict[str, bool]:
        return figures.verdicts(self.per_class(), len(self.false_actions), self.node_days)


def _missed(f: Fault) -> str:
    after = f" after {f.answered_at - f.start:.0f} s" if f.answered_at else ""
    return f"{f.node} at +{f.start - T0:.0f} s: {f.answer or 'nothing'}{after}"


def simulate(days: dict[str, float], faults_per_class: int, seed: int, settings: dict[str, Any] | None = None,
             gap_s: float = 4 * 3600) -> Figures:  # fmt: skip
    """``days`` simulated of each deployment ("ray": the Ray executor, "mp": vLLM's mp executor across nodes), two
    nodes each, ``faults_per_class`` faults of each of its classes; ``settings``: [remediation] keys set (else the
    shipped defaults)."""
    limits = dict(settings or {})
    started = time.perf_counter()
    actions: list[dict[str, Any]] = []
    faults: list[Fault] = []
    pages: list[dict[str, Any]] = []
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the audit's fsync costs nothing there
    for i, (deployment, n) in enumerate(days.items()):
        with tempfile.TemporaryDirectory(prefix="replay-", dir=base) as tmp:
            sim = Sim(seed + i, n, faults_per_class, deployment, limits, Path(tmp), gap_s)
            sim.run()
            actions += sim.actions
            faults += sim.faults
            pages += sim.pages
    return Figures(2 * sum(days.values()), actions, faults, pages, time.perf_counter() - started, limits)


def report(fig: Figures) -> str:
    rate = len(fig.false_actions) / fig.node_days * 1000
    bound = 3.0 / fig.node_days * 1000  # 95 % upper bound on the rate when none was seen (rule of three)
    lines = [
        f"simulated {fig.node_days:g} node-days (2 nodes, Ray and mp deployments) in {fig.wall_s:.0f} s; "
        f"{len(fig.faults)} faults injected; settings: shipped defaults"
        + (f" but {fig.settings}" if fig.settings else ""),
        f"automatic actions: {len(fig.actions)}, false: {len(fig.false_actions)} = {rate:.2f} per 1,000 node-days"
        + (f" (none seen: below {bound:.1f} per 1,000 at 95 % confidence)" if not fig.false_actions else ""),
    ]
    for a in fig.false_actions:
        lines.append(f"  FALSE {a['action']} on {a['node']} at +{a['t'] - T0:.0f} s: {a['verdict']}; benign events "
                     f"within 30 min: {a['benign'] or 'none'}; load {a['load']}; seen: {a['seen']}")  # fmt: skip
    lines += figures.class_table(fig.per_class(), digits=0)
    stray = [p for p in fig.pages if not p["faults"]]
    lines.append(f"pages sent by remediation (not an action; no target): {len(fig.pages)}, "
                 f"{len(stray)} with no fault open")  # fmt: skip
    for page in stray[:5]:
        lines.append(f"  page on {page['node']} at +{page['t'] - T0:.0f} s: {page['problem']}: {page['reason']}")
    lines += figures.verdict_lines(fig.verdicts())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=float, default=200.0, help="simulated days of the Ray deployment (2 nodes)")
    p.add_argument("--mp-days", type=float, default=25.0, help="simulated days of the mp deployment (2 nodes)")
    p.add_argument("--faults", type=int, default=20, help="faults injected per class")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a [remediation] setting, e.g. hold_s=0 (default: the shipped settings)",
    )
    p.add_argument("--seed", type=int, default=39)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    eventlog.configure("error")  # the engine's decision lines are in its audit; the figures are what matter here
    settings = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    fig = simulate({"ray": args.days, "mp": args.mp_days}, args.faults, args.seed, settings)
    if args.json:
        doc = {"node_days": fig.node_days, "false_actions": fig.false_actions, "per_class": fig.per_class(),
               "verdicts": fig.verdicts(), "pages": len(fig.pages), "wall_s": fig.wall_s}  # fmt: skip
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(report(fig))
    return 0 if all(fig.verdicts().values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Evidence from before a restart is no reason to climb the ladder (issue 39: 26 of 126 pages cited it).

After a restart ends, the checks' next runs can still report what they saw before it: the logs check holds a
matched line for its ``hold_s`` (900 s), and the head's peer comparison relays a worker's result that has not run
again since. A run that started after the restart is fresh; its evidence is not. Each finding that rests on older
evidence carries when it was seen (``Finding.seen_at``) and remediation acts on none from before its last action
ended. Both through the real path: the logs check following a file, the peer comparison reading the worker's
``/state`` over HTTP through the real validation, the check runner, the engine in act mode on an injected clock
with a stand-in command runner. A new line, or the worker's check saying it again after the restart, still climbs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from dgxdoctor.checks.base import Check, CheckRunner
from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck, VllmExecutorSettings
from dgxdoctor.config import RemediationSettings
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.result import CheckResult
from dgxdoctor.sources.commands import CommandResult
from dgxdoctor.validation import validate
from proctree import write_process

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCCL_TIMEOUT = (FIXTURES / "logs" / "nccl_timeout.log").read_text().splitlines()
T0 = 1_800_000_000.0
WORKER_URL = "http://dgx-b:9835"
TOKEN = "stale-evidence-token-0123456789ab"
HEADLESS = ("/usr/bin/python3", "/opt/vllm/bin/vllm", "serve", "/models/m", "--tensor-parallel-size", "16",
            "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501",
            "--headless")  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def services(request: httpx.Request) -> httpx.Response:
    """vLLM, Ray's dashboard and the worker's step API as an action's steps and verification see them."""
    path = request.url.path
    if path == "/remediation/step":
        return httpx.Response(200, json={"ok": True, "detail": "done"})
    if path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "m"}]})
    if path == "/v1/chat/completions":
        return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
    if path == "/api/v0/nodes":
        return httpx.Response(200, content=(FIXTURES / "ray" / "healthy-nodes-detail.json").read_bytes())
    return httpx.Response(200)  # /health


class Head:
    """The head's remediation in act mode over the latest results of its checks, run by the check runner."""

    def __init__(self, root: Path, clock: Clock, executor: str | None = None) -> None:
        self.clock = clock
        self.results: dict[str, CheckResult] = {}
        self.commands: list[tuple[str, ...]] = []
        self.pages: list[str] = []
        self.on_start: Callable[[], object] = lambda: None  # what a start command brings back
        env = Environment(node="dgx-a", http_transport=httpx.MockTransport(services), run_command=self.run,
                          role="head", executor=executor)  # type: ignore[arg-type]  # fmt: skip
        settings = validate(RemediationSettings, {"mode": "act", "role": "head"})
        targets = Targets(VllmTarget("http://127.0.0.1:8000", "m"), "http://127.0.0.1:8265", 2, 16, (WORKER_URL,),
                          TOKEN, executor)  # fmt: skip
        (root / "remediation").mkdir()
        self.remediator = Remediator(settings, self.page, "dgx-a", root / "remediation", targets,
                                     lambda: self.results, clock=clock, env=env)  # fmt: skip
        self.remediator.capture = None
        self.runner = CheckRunner(Environment(node="dgx-a", clock=clock))

    def run(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        self.commands.append(tuple(argv))
        if "start" in argv:
            self.on_start()
        return CommandResult(tuple(argv), 0, "", "")

    def page(self, node: str, problem: str, suggested: str, reason: str, now: float) -> str:
        self.pages.append(f"{problem}: {reason}")
        return "recorded"

    async def check(self, check: Check) -> None:
        self.results[check.name] = await self.runner.run(check)

    async def evaluate(self) -> None:
        r = self.remediator
        await r.evaluate()
        if r.acting is not None:
            task, r.acting = r.acting, None
            await task

    def actions(self) -> list[str]:
        return [a["action"] for a in _records(self.remediator) if a.get("event") == "action"]


def _records(r: Remediator) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.audit.path.read_text().splitlines()]


async def live(head: Head, seconds: float, every: Callable[[], Any]) -> None:
    """``seconds`` of the head's life in 5 s steps: its checks (``every``), then an evaluation."""
    end = head.clock.now + seconds
    while head.clock.now < end:
        await every()
        await head.evaluate()
        head.clock.now += 5.0


async def test_a_held_log_line_from_before_the_cluster_restart_pages_nobody(tmp_path: Path) -> None:
    clock = Clock()
    head = Head(tmp_path, clock)
    log = tmp_path / "vllm.log"
    log.write_text("")
    (tmp_path / "logs-state").mkdir()
    settings = validate(LogsSettings, {"vllm_paths": [str(log)], "ray_paths": [], "journal_units": []})
    logs = LogsCheck(
        settings, Environment(node="dgx-a", clock=clock, one_shot=False, state_dir=tmp_path / "logs-state")
    )

    async def every() -> None:
        await head.check(logs)

    await live(head, 10, every)
    with log.open("a") as f:
        f.write("".join(f"{line}\n" for line in NCCL_TIMEOUT))  # torch's NCCL watchdog: restart_cluster
    await live(head, 60, every)
    assert head.actions() == ["restart_cluster"], _records(head.remediator)
    # The logs check keeps reporting the line for its hold_s (900 s) in every fresh run after the restart.
    await live(head, 300, every)
    assert "NCCL_TIMEOUT" in [f.code for f in head.results["logs"].findings]
    assert head.actions() == ["restart_cluster"] and head.pages == [], head.pages
    # The watchdog fires again after the restart: that is the restart not curing it, and the ladder pages.
    with log.open("a") as f:
        f.write(f"{NCCL_TIMEOUT[-1]}\n")
    await live(head, 60, every)
    assert head.actions() == ["restart_cluster"]
    assert [p.split(": ", 1)[1] for p in head.pages] == [
        "the ladder ended (restarts did not cure it): page an operator"
    ]


async def test_a_workers_result_from_before_the_mp_restart_pages_nobody(tmp_path: Path) -> None:
    """The head (mp executor) compares the worker's /state; the worker's vllm_executor check runs every 30 s, so
    for up to 30 s after the restart its latest result still says its headless vLLM is missing."""
    clock = Clock()
    head = Head(tmp_path, clock, executor="mp")
    proc = tmp_path / "proc"
    worker_env = Environment(node="dgx-b", role="worker", executor="mp", proc_root=proc, clock=clock)
    executor = VllmExecutorCheck(VllmExecutorSettings(), worker_env)
    worker_runner = CheckRunner(Environment(node="dgx-b", clock=clock))
    worker: dict[str, CheckResult] = {}

    def headless(running: bool) -> None:
        for child in sorted(proc.rglob("*"), reverse=True) if proc.exists() else ():
            child.unlink() if child.is_file() or child.is_symlink() else child.rmdir()
        proc.mkdir(exist_ok=True)
        if running:
            write_process(proc, 4242, "vllm", HEADLESS)

    def serve(request: httpx.Request) -> httpx.Response:
        doc = ResultsDocument.of("dgx-b", list(worker.values()), clock()).state()
        return httpx.Response(200, content=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})

    fleet = Fleet(local_state=lambda without: ResultsDocument.of("dgx-a", [], clock()).state(),
                  peers=lambda: Peers((WORKER_URL,), TOKEN, 5.0))  # fmt: skip
    peer_env = Environment(node="dgx-a", http_transport=httpx.MockTransport(serve), one_shot=False, fleet=fleet,
                           clock=clock)  # fmt: skip
    compare = PeerCompareCheck(validate(PeerCompareSettings, {}), peer_env)
    last_executor = [-1e18]

    async def every() -> None:
        if clock.now - last_executor[0] >= 30:  # the worker's check, at its interval
            worker["vllm_executor"] = await worker_runner.run(executor)
            last_executor[0] = clock.now
        await head.check(compare)

    headless(True)
    head.on_start = lambda: headless(True)  # the mp order (the worker's step, then the head's start) brings it back
    await live(head, 40, every)
    headless(False)  # the worker's headless vLLM is gone
    await live(head, 60, every)
    assert head.actions() == ["restart_cluster"], _records(head.remediator)
    assert [f.code for f in head.results["peer_compare"].findings] == ["PEER_MP_WORKER_DOWN"]
    await live(head, 120, every)
    assert head.actions() == ["restart_cluster"] and head.pages == [], head.pages
    # Gone again, seen by the worker's check after the restart: the restart did not cure it, the ladder pages.
    headless(False)
    await live(head, 90, every)
    assert head.actions() == ["restart_cluster"]
    assert [p.split(": ", 1)[1] for p in head.pages] == [
        "the ladder ended (restarts did not cure it): page an operator"
    ]

"""The remediation loop idle: an evaluation that would decide what the last one did is skipped, so a daemon with a
standing finding does not re-read, validate and compare its state file every second; whatever changes (a result,
an alert, the state file, a deadline) is still acted on at the next tick. The state file is counted through the
engine's ``state_file`` seam; time is a fake clock advanced a second per tick."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dgxdoctor.alerts.webhook import IncomingAlert
from dgxdoctor.config import RemediationSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.result import CheckResult, Finding, Status
from dgxdoctor.sources.statefile import StateFile
from dgxdoctor.validation import validate

T0 = 1_000_000.0
# As the check runner hands them on: with what follows from each finding (judge.consequence).
IB_DOWN = (judged(Finding("IB_PORT_DOWN", Status.CRITICAL, "mlx5_0/1 down")),)
DEAD = (judged(Finding("VLLM_DEAD", Status.CRITICAL, "refused")),)


class CountedStateFile(StateFile):
    """The guard's state file, counting the engine's reads and writes."""

    def __init__(self, state_dir: Path) -> None:
        real = guard_state_file(state_dir)
        super().__init__(real.path, lock_path=real.lock_path, mode=real.mode, indent=real.indent)
        self.reads = self.writes = 0

    def read(self) -> dict[str, Any]:
        self.reads += 1
        return super().read()

    def write(self, doc: dict[str, Any]) -> None:
        self.writes += 1
        super().write(doc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def remediator(tmp_path: Path, results: dict[str, CheckResult], clock: Clock, **kw: Any) -> Remediator:
    cfg: dict[str, Any] = {"mode": "act", "role": "head", "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 1}
    settings = validate(RemediationSettings, {**cfg, "commands": {"restart_vllm": ["true"]}, **kw})
    targets = Targets(VllmTarget("http://vllm:8000", "tiny"), "http://ray:8265", 2, 16, (), "t" * 16)
    env = Environment(node="dgx-a")
    state = CountedStateFile(tmp_path)
    return Remediator(settings, None, "dgx-a", tmp_path, targets, lambda: results, clock=clock, env=env,
                      state_file=state)  # fmt: skip


def counted(r: Remediator) -> CountedStateFile:
    assert isinstance(r.state_file, CountedStateFile)
    return r.state_file


async def ticks(r: Remediator, clock: Clock, n: int) -> None:
    for _ in range(n):
        clock.now += 1.0
        await r.evaluate()


def ib_down(at: float) -> CheckResult:
    return CheckResult("infiniband", Status.CRITICAL, "mlx5_0/1 down", IB_DOWN, started_at=at)


async def test_a_standing_finding_reads_the_state_file_once_not_every_tick(tmp_path: Path) -> None:
    clock = Clock()
    results = {"infiniband": ib_down(T0)}
    r = remediator(tmp_path, results, clock)
    await ticks(r, clock, 5)
    state = counted(r)
    reads, writes = state.reads, state.writes
    assert writes == 1  # the problem's onset
    for _ in range(6):  # a minute: the check runs again every 10 s and finds the same
        results["infiniband"] = ib_down(clock.now)
        await ticks(r, clock, 10)
    assert (state.reads, state.writes) == (reads, writes)
    decisions = [e for e in AuditLog(tmp_path).tail(100) if e["event"] == "decision"]
    assert [(d["verdict"], d["action"]) for d in decisions] == [("suggest", "page")]


async def test_what_changes_is_seen_at_the_next_tick(tmp_path: Path) -> None:
    clock = Clock()
    results = {"infiniband": ib_down(T0)}
    r = remediator(tmp_path, results, clock, mode="observe")
    await ticks(r, clock, 3)
    state = counted(r)
    reads = state.reads
    results["vllm"] = CheckResult("vllm", Status.CRITICAL, "dead", DEAD, started_at=clock.now)
    await ticks(r, clock, 1)
    assert state.reads == reads + 1
    decided = [e["problem"] for e in AuditLog(tmp_path).tail(100) if e["event"] == "decision"]
    assert decided[-1] == "check:vllm:restart_vllm"
    await ticks(r, clock, 3)
    reads = state.reads
    doc = guard_state_file(tmp_path).read()  # another writer: the breaker opened by hand
    guard_state_file(tmp_path).write({**doc, "breaker": {"open": True, "reason": "by hand", "opened_at": T0}})
    await ticks(r, clock, 1)
    assert state.reads == reads + 1 and r.breaker_open  # (observe mode exports no breaker: it stops nothing)
    await ticks(r, clock, 3)
    reads = state.reads
    labels = {"alertname": "DgxdoctorRayDown", "node": "dgx-a", "dgxdoctor_action": "restart_cluster"}
    r.accept_alerts([IncomingAlert("firing", labels, "f1", "2026-11-30T10:00:00Z", clock.now)])
    await ticks(r, clock, 1)
    assert state.reads == reads + 1


async def test_a_hold_ends_on_the_tick_it_would_have_without_skipping(tmp_path: Path) -> None:
    clock = Clock()
    results = {"vllm": CheckResult("vllm", Status.CRITICAL, "dead", DEAD, started_at=T0)}
    r = remediator(tmp_path, results, clock, hold_s=5)
    await ticks(r, clock, 1)
    onset = clock.now
    for _ in range(10):
        await ticks(r, clock, 1)
        if r.acting is not None:
            break
    assert r.acting is not None and clock.now == onset + 5
    await r.acting
    started = [e for e in AuditLog(tmp_path).tail(100) if e["event"] == "action_started"]
    assert [e["ts"] for e in started] == [onset + 5]

"""The scheduler with test-only checks. Waits on events (with generous limits); asserts nothing about timing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dgxdoctor import eventlog
from dgxdoctor.checks.base import Check, CheckRunner
from dgxdoctor.daemon.scheduler import CheckScheduler, jitter_for, next_fire
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Finding, Status
from fakechecks import FakeSettings, FollowingCheck, SlowCheck, StaticCheck

ENV = Environment(node="dgx-a", state_dir=Path("/nonexistent"))


@pytest.fixture
async def sched() -> AsyncIterator[CheckScheduler]:
    store = ResultStore("dgx-a")
    s = CheckScheduler(CheckRunner(ENV), store, heartbeat_s=0.05)
    s.start()
    yield s
    s.shutdown()


async def wait_for(predicate: object, limit_s: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), limit_s)


async def test_runs_checks_and_stores_results(sched: CheckScheduler) -> None:
    ok = StaticCheck(FakeSettings(), ENV)
    boom = StaticCheck(FakeSettings(), ENV, outcome=RuntimeError("nvml exploded"), name="boom")
    sched.add(ok)
    sched.add(boom)
    await wait_for(lambda: ok.runs >= 3 and boom.runs >= 3)
    assert sched.store.get("static").status is Status.OK  # type: ignore[union-attr]
    failed = sched.store.get("boom")
    assert failed is not None and failed.status is Status.UNKNOWN and "nvml exploded" in (failed.error or "")
    assert sched.healthy()


async def test_never_two_runs_of_one_check(sched: CheckScheduler) -> None:
    slow = SlowCheck(FakeSettings(interval_s=0.01), ENV)
    sched.add(slow)
    await wait_for(slow.started.is_set)
    await asyncio.sleep(0.2)  # many intervals pass while the run blocks
    assert slow.runs == 1 and slow.max_active == 1
    slow.release.set()
    await wait_for(lambda: slow.runs >= 2)
    assert slow.max_active == 1


async def test_event_source_started_and_stopped(sched: CheckScheduler) -> None:
    follower = FollowingCheck(FakeSettings(), ENV)
    sched.add(follower)
    assert follower.loop is asyncio.get_running_loop()
    await wait_for(lambda: sched.store.get("following") is not None)
    sched.remove("following")
    assert follower.stopped and sched.store.get("following") is None


async def test_an_event_runs_the_check_at_once_and_wake_ups_coalesce(sched: CheckScheduler) -> None:
    follower = FollowingCheck(FakeSettings(interval_s=3600), ENV)
    sched.add(follower)
    await wait_for(lambda: sched.store.get("following") is not None)
    assert follower.runs == 1
    await asyncio.to_thread(sched.wake, "following")  # the follower's thread, not the loop
    await wait_for(lambda: getattr(sched.store.get("following"), "summary", "") == "following: run 2")
    await asyncio.to_thread(lambda: [sched.wake("following") for _ in range(50)])
    await wait_for(lambda: follower.runs >= 3)
    await asyncio.sleep(0.2)
    # 50 wake-ups coalesce: a run, at most one more behind it, and again only if the waking thread was
    # descheduled between two of its calls long enough for a run to finish (a busy machine)
    assert follower.runs <= 12
    sched.wake("no_such_check")  # a check removed meanwhile: nothing happens


async def test_one_log_line_per_transition(sched: CheckScheduler) -> None:
    check = StaticCheck(FakeSettings(), ENV)
    with eventlog.capture_logs() as logs:
        sched.add(check)
        await wait_for(lambda: check.runs >= 3)
        check.outcome = CheckResult("static", Status.CRITICAL, "broke")
        seen = check.runs
        await wait_for(lambda: check.runs >= seen + 3)
    events = [e for e in logs if e["event"] == "check_transition"]
    transitions = [(e["old"], e["new"]) for e in events]
    assert transitions == [(None, "ok"), ("ok", "critical")]
    # Each line is plain JSON as logged (no default= to hide a value JSON cannot hold), and reads back the same.
    assert json.loads(json.dumps(events)) == events


class RecordingRunner(CheckRunner):
    """Says when a run returned; the scheduler handles its result before the loop turns again."""

    def __init__(self, env: Environment) -> None:
        super().__init__(env)
        self.returned: list[str] = []

    async def run(self, check: Check) -> CheckResult:
        result = await super().run(check)
        self.returned.append(check.name)
        return result


async def test_replaced_check_result_is_dropped() -> None:
    runner = RecordingRunner(ENV)
    sched = CheckScheduler(runner, ResultStore("dgx-a"), heartbeat_s=0.05)
    sched.start()
    try:
        slow = SlowCheck(FakeSettings(), ENV)
        sched.add(slow)
        await wait_for(slow.started.is_set)
        sched.remove("slow")
        slow.release.set()
        await wait_for(lambda: "slow" in runner.returned)
        assert sched.store.get("slow") is None
    finally:
        sched.shutdown()


def test_jitter_is_bounded() -> None:
    assert jitter_for(2) == pytest.approx(0.2) and jitter_for(600) == 5.0


async def test_a_stalled_engine_asks_ras_at_once(sched: CheckScheduler) -> None:
    """The vllm check's ENGINE_HUNG (or an NCCL timeout in the logs) wakes the ras check, not its next interval."""
    hung = CheckResult("vllm", Status.CRITICAL, "hung", findings=(Finding("ENGINE_HUNG", Status.CRITICAL, "x"),))
    ras = StaticCheck(FakeSettings(interval_s=3600), ENV, name="ras")
    sched.add(ras)
    await wait_for(lambda: ras.runs >= 1)
    sched.add(StaticCheck(FakeSettings(interval_s=3600), ENV, outcome=hung, name="vllm"))
    await wait_for(lambda: ras.runs >= 2)


def test_fires_missed_during_a_long_run_coalesce_into_the_next_one() -> None:
    assert next_fire(100.0, 10.0, 105.0) == 110.0
    assert next_fire(100.0, 10.0, 110.0) == 120.0  # on the fire time itself: the next one
    assert next_fire(100.0, 10.0, 147.5) == 150.0  # a 47 s run over a 10 s interval: one run at 150, not four


async def test_a_job_that_raises_is_logged_and_runs_again(sched: CheckScheduler) -> None:
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise OSError("disk full")

    with eventlog.capture_logs() as logs:
        sched.add_job("writer", write, 0.02)
        await wait_for(lambda: len(calls) >= 3)
    sched.remove_job("writer")
    assert not sched.has_job("writer")
    failed = [e for e in logs if e["event"] == "job_failed"]
    assert failed and failed[0]["job"] == "writer" and "disk full" in failed[0]["error"]

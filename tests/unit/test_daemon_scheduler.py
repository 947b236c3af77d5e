"""The schedule on APScheduler with test-only checks: what runs, when a run is skipped or coalesced, what a wake-up
does. Waits on events (with generous limits; APScheduler's own events where they say it); asserts nothing about
timing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_SUBMITTED, JobSubmissionEvent

from dgxdoctor import eventlog
from dgxdoctor.checks.base import Check, CheckRunner
from dgxdoctor.daemon.scheduler import CheckScheduler
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


@pytest.mark.parametrize(("interval_s", "jitter_s", "grace_s"), [(2.0, 0.2, 2), (600.0, 5.0, 600), (0.05, 0.005, 1)])
async def test_each_check_is_one_apscheduler_job(
    sched: CheckScheduler, interval_s: float, jitter_s: float, grace_s: int
) -> None:
    """One instance at a time, missed fires coalesced, up to 10% (at most 5 s) of jitter, a late run still run
    within an interval."""
    sched.add(StaticCheck(FakeSettings(interval_s=interval_s), ENV))
    job = sched.aps.get_job("static")
    assert job is not None and (job.max_instances, job.coalesce, job.misfire_grace_time) == (1, True, grace_s)
    assert job.trigger.interval == timedelta(seconds=interval_s)
    assert job.trigger.jitter == pytest.approx(jitter_s)


async def test_a_stalled_engine_asks_ras_at_once(sched: CheckScheduler) -> None:
    """The vllm check's ENGINE_HUNG (or an NCCL timeout in the logs) wakes the ras check, not its next interval."""
    hung = CheckResult("vllm", Status.CRITICAL, "hung", findings=(Finding("ENGINE_HUNG", Status.CRITICAL, "x"),))
    ras = StaticCheck(FakeSettings(interval_s=3600), ENV, name="ras")
    sched.add(ras)
    await wait_for(lambda: ras.runs >= 1)
    sched.add(StaticCheck(FakeSettings(interval_s=3600), ENV, outcome=hung, name="vllm"))
    await wait_for(lambda: ras.runs >= 2)


async def test_fires_during_a_long_run_are_skipped_not_queued(sched: CheckScheduler) -> None:
    skipped: list[JobSubmissionEvent] = []
    sched.aps.add_listener(lambda e: skipped.append(e) if e.job_id == "slow" else None, EVENT_JOB_MAX_INSTANCES)
    slow = SlowCheck(FakeSettings(interval_s=0.01), ENV)
    sched.add(slow)
    await wait_for(slow.started.is_set)
    await wait_for(lambda: len(skipped) >= 3)  # three fire times came while the run held
    assert slow.runs == 1
    slow.release.set()
    await wait_for(lambda: slow.runs >= 2)
    assert slow.max_active == 1


async def test_fires_missed_while_the_scheduler_slept_coalesce_into_one_run(sched: CheckScheduler) -> None:
    submitted: list[JobSubmissionEvent] = []
    check = StaticCheck(FakeSettings(interval_s=0.02), ENV)
    sched.add(check)
    await wait_for(lambda: check.runs >= 1)
    sched.aps.pause()  # as a loop kept busy would: fire times pass unprocessed
    job = sched.aps.get_job("static")
    assert job is not None and job.next_run_time is not None
    due = job.next_run_time
    await asyncio.sleep(0.3)  # some 15 fire times
    sched.aps.add_listener(lambda e: submitted.append(e) if e.job_id == "static" else None, EVENT_JOB_SUBMITTED)
    sched.aps.resume()
    await wait_for(lambda: len(submitted) >= 1)
    (run_time,) = submitted[0].scheduled_run_times  # one run for all of them
    assert run_time >= due + timedelta(seconds=0.02 * 3)  # the latest of the missed fire times


async def test_a_wake_up_during_a_run_runs_the_check_once_more_after_it(sched: CheckScheduler) -> None:
    """APScheduler skips a run asked for while one goes (max_instances); that run may have read its source before
    the event, so the wake-up waits for it and runs the check again."""
    slow = SlowCheck(FakeSettings(interval_s=3600), ENV)
    sched.add(slow)
    await wait_for(slow.started.is_set)
    for _ in range(5):
        sched.wake("slow")
    await asyncio.sleep(0)  # the wake-ups are handled on the loop
    slow.started.clear()
    slow.release.set()
    await wait_for(slow.started.is_set)  # the second run, an hour before its interval
    assert slow.runs == 2 and slow.max_active == 1


async def test_a_check_replaced_while_it_runs_runs_once_the_old_run_ends(sched: CheckScheduler) -> None:
    """A reload rebuilds a check whose run is going: the new one's first run follows the old run, not an interval
    later (APScheduler counts instances per job id and skips a start while the old run holds it)."""
    skipped: list[JobSubmissionEvent] = []
    sched.aps.add_listener(lambda e: skipped.append(e) if e.job_id == "slow" else None, EVENT_JOB_MAX_INSTANCES)
    old = SlowCheck(FakeSettings(interval_s=3600), ENV)
    sched.add(old)
    await wait_for(old.started.is_set)
    new = StaticCheck(FakeSettings(interval_s=3600), ENV, name="slow")
    sched.remove("slow", forget=False)
    sched.add(new)
    await wait_for(lambda: len(skipped) >= 1)  # its first fire came while the old run held the job
    assert new.runs == 0
    old.release.set()
    await wait_for(lambda: new.runs == 1)
    await wait_for(lambda: getattr(sched.store.get("slow"), "summary", "") == "fine")


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

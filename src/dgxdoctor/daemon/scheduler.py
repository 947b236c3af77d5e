"""One APScheduler job per check: its own interval, never two runs at once, missed runs coalesced, jitter.

Runs go through ``checks.base.CheckRunner`` (timeout, exception -> UNKNOWN, duration); results go to the
store; a status change is logged once (one line per transition, not per run). A check is started (through the
runner, ``Check.start``) when it is added and stopped when it is removed or the scheduler shuts down. An event
source asks for a run now with ``wake(name)`` (from any thread; the daemon hands it to checks as
``env.fleet.wake``): the event is then in /metrics and /state within milliseconds instead of at the next interval.
Wake-ups coalesce (at most one more run queued behind a running one), and a wake run and the scheduled run take
turns, never two runs of one check at once.
A heartbeat job proves the scheduler is turning: ``/healthz`` and the systemd watchdog read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from dgxdoctor.checks.base import Check, CheckRunner, probe_labels
from dgxdoctor.fleet.store import ResultStore, Transition
from dgxdoctor.judge.ras import asks_ras
from dgxdoctor.result import Status

log = structlog.get_logger(__name__)

HEARTBEAT_S = 5.0
# A heartbeat older than this many periods means the scheduler has stopped turning.
HEARTBEAT_STALE_PERIODS = 3
MAX_JITTER_S = 5.0
HEARTBEAT_JOB = "__heartbeat__"


def jitter_for(interval_s: float) -> float:
    """Up to 10% of the interval, at most 5 s: spreads runs without making cheap checks irregular."""
    return min(interval_s * 0.1, MAX_JITTER_S)


class CheckScheduler:
    def __init__(
        self,
        runner: CheckRunner,
        store: ResultStore,
        monotonic: Callable[[], float] = time.monotonic,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.runner = runner
        self.store = store
        self.monotonic = monotonic
        self.heartbeat_s = heartbeat_s
        self.checks: dict[str, Check] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: dict[str, bool] = {}  # check -> another wake-up arrived while its wake run was going
        self._wake_tasks: set[asyncio.Future[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self.last_heartbeat: float | None = None
        self.scheduler = AsyncIOScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.scheduler.start()
        self._heartbeat()
        self.scheduler.add_job(
            self._heartbeat, IntervalTrigger(seconds=self.heartbeat_s), id=HEARTBEAT_JOB, name="heartbeat"
        )

    def shutdown(self) -> None:
        self.runner.stop_all(self.checks.values())
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def _heartbeat(self) -> None:
        self.last_heartbeat = self.monotonic()

    def heartbeat_age(self) -> float | None:
        if self.last_heartbeat is None:
            return None
        return self.monotonic() - self.last_heartbeat

    def healthy(self) -> bool:
        """The scheduler runs and its heartbeat job fired recently (so the event loop turns too)."""
        age = self.heartbeat_age()
        return self.scheduler.running and age is not None and age < self.heartbeat_s * HEARTBEAT_STALE_PERIODS

    # -- checks ----------------------------------------------------------------------------------------

    def add(self, check: Check, first_run_in_s: float = 0.0) -> None:
        name = check.name
        if name in self.checks:
            self.remove(name)
        self.checks[name] = check
        self.store.declare(name, probe_labels(check))
        interval = check.settings.interval_s
        self.scheduler.add_job(
            self._run,
            IntervalTrigger(seconds=interval, jitter=jitter_for(interval)),
            args=[name],
            id=name,
            name=name,
            next_run_time=datetime.now().astimezone() + timedelta(seconds=first_run_in_s),
        )
        self.runner.start(check)  # a broken event source is logged there and does not stop the daemon

    def remove(self, name: str, forget: bool = True) -> None:
        check = self.checks.pop(name, None)
        if self.scheduler.get_job(name) is not None:
            self.scheduler.remove_job(name)
        if check is not None:
            self.runner.stop(check)
        if forget:
            self.store.forget(name)

    def add_job(self, job_id: str, func: Callable[[], Any], interval_s: float) -> None:
        """A non-check periodic job (the textfile writer)."""
        if self.scheduler.get_job(job_id) is not None:
            self.scheduler.remove_job(job_id)
        self.scheduler.add_job(func, IntervalTrigger(seconds=interval_s), id=job_id, name=job_id)

    def remove_job(self, job_id: str) -> None:
        if self.scheduler.get_job(job_id) is not None:
            self.scheduler.remove_job(job_id)

    def wake(self, name: str) -> None:
        """Run the check now; callable from any thread (an event source's follower)."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is stopping
            loop.call_soon_threadsafe(self._wake, name)

    def _wake(self, name: str) -> None:
        if name not in self.checks:
            return
        if name in self._woken:  # a run is queued or running: one more after it sees this event too
            self._woken[name] = True
            return
        self._woken[name] = False
        task = asyncio.ensure_future(self._wake_runs(name))
        self._wake_tasks.add(task)
        task.add_done_callback(self._wake_tasks.discard)

    async def _wake_runs(self, name: str) -> None:
        try:
            while True:
                await self._run(name)
                if not self._woken.get(name):
                    return
                self._woken[name] = False
        finally:
            self._woken.pop(name, None)

    async def _run(self, name: str) -> None:
        check = self.checks.get(name)
        if check is None:
            return
        # A wake-up run and the scheduled run take turns: never two runs of one check at once.
        async with self._locks.setdefault(name, asyncio.Lock()):
            result = await self.runner.run(check)
        if self.checks.get(name) is not check:
            return  # removed or replaced by a reload while it ran
        transition = self.store.put(result)
        if transition is not None:
            log_transition(transition)
        # A stalled engine or an NCCL timeout: ask NCCL's RAS now which rank it is (checks/ras.py).
        if name != "ras" and asks_ras(f.code for f in result.findings):
            self._wake("ras")


def log_transition(t: Transition) -> None:
    level = {Status.CRITICAL: "error", Status.WARNING: "warning", Status.UNKNOWN: "warning"}.get(t.new, "info")
    getattr(log, level)(
        "check_transition",
        check=t.check,
        old=t.old.value if t.old else None,
        new=t.new.value,
        summary=t.result.summary,
        findings=[f"{f.code}:{f.subject}" if f.subject else f.code for f in t.result.findings if f.status.rank > 1],
        error=t.result.error,
    )

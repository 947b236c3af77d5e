"""The daemon's schedule on APScheduler: one job per check with its own interval, ``max_instances=1``, ``coalesce``,
jitter and a misfire grace, in an ``AsyncIOScheduler`` on the daemon's event loop.

Runs go through ``checks.base.CheckRunner`` (timeout, exception -> UNKNOWN, duration); results go to the
store; a status change is logged once (one line per transition, not per run). A check is started (through the
runner, ``Check.start``) when it is added and stopped when it is removed or the scheduler shuts down. An event
source asks for a run now with ``wake(name)`` (from any thread; the daemon hands it to checks as
``env.fleet.wake``): the job's next run time becomes now, so the event is in /metrics and /state within
milliseconds instead of at the next interval, and the next scheduled run is one interval after it. A wake-up
that comes while the check runs is kept (several coalesce into one) and the job runs again as soon as that run
has ended: APScheduler would skip a run asked for while one is going (``max_instances``), and that run may have
read its source before the event.
A heartbeat job proves the scheduler is turning: ``/healthz`` and the systemd watchdog read it.

APScheduler keeps run times on the wall clock (UTC; the old loop used the monotonic clock): a clock stepped back
holds every run, the heartbeat's included, for the length of the step, and a step forward by years (a node booted
with a dead RTC) keeps the loop counting missed fire times before it coalesces them. Past the heartbeat's limit
``healthy()`` is False, so the systemd watchdog restarts the daemon, which schedules afresh.

Coroutine jobs (the checks, the heartbeat) run on the loop; a plain function (the textfile writer) runs in the
loop's default thread pool, as APScheduler's asyncio executor does, so a write that blocks on a hung file system
does not stop the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from dgxdoctor import eventlog
from dgxdoctor.checks.base import Check, CheckRunner, probe_labels
from dgxdoctor.fleet.store import ResultStore, Transition
from dgxdoctor.judge.ras import asks_ras
from dgxdoctor.result import Status

log = eventlog.get_logger(__name__)

HEARTBEAT_S = 5.0
# A heartbeat older than this many periods means the scheduler has stopped turning.
HEARTBEAT_STALE_PERIODS = 3
MAX_JITTER_S = 5.0
HEARTBEAT_JOB = "__heartbeat__"
UTC = timezone.utc


def jitter_for(interval_s: float) -> float:
    """Up to 10% of the interval, at most 5 s: spreads runs without making cheap checks irregular. APScheduler counts
    each fire time from the last, jittered one, so runs come on average ``interval + jitter / 2`` apart."""
    return min(interval_s * 0.1, MAX_JITTER_S)


def misfire_grace_for(interval_s: float) -> int:
    """A run that starts late (a busy loop) still runs if less than an interval late (APScheduler takes whole
    seconds); later than that, ``coalesce`` has already folded it into the next fire time."""
    return max(1, math.ceil(interval_s))


def _now() -> datetime:
    return datetime.now(UTC)


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
        # UTC throughout: no local time zone lookup, and a DST change moves no run.
        self.aps = AsyncIOScheduler(timezone=UTC)
        self.aps.add_listener(self._job_ended, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
        self._busy: set[str] = set()  # checks whose run is going
        self._again: set[str] = set()  # checks woken while they ran: one more run once that run has ended
        self.last_heartbeat: float | None = None
        self.running = False

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.running = True
        self._beat()
        self._add(HEARTBEAT_JOB, self._heartbeat, self.heartbeat_s, first_run_in_s=self.heartbeat_s)
        self.aps.start()

    def shutdown(self) -> None:
        """Stop every check's event source and the scheduler; a check run in progress is cancelled when the loop
        next turns (its thread, if stuck in a hung call, is left behind)."""
        was_running, self.running = self.running, False
        self.runner.stop_all(self.checks.values())
        if was_running and self.aps.running:
            self.aps.shutdown(wait=False)

    def _add(
        self,
        job_id: str,
        func: Callable[..., Any],
        interval_s: float,
        first_run_in_s: float | None = None,
        jitter_s: float | None = None,
        args: tuple[Any, ...] = (),
    ) -> None:
        """One job: first run ``first_run_in_s`` from now (None: one interval), then every ``interval_s``."""
        first = interval_s if first_run_in_s is None else first_run_in_s
        self.aps.add_job(
            func,
            IntervalTrigger(seconds=interval_s, jitter=jitter_s or None, timezone=UTC),
            args=args,
            id=job_id,
            name=job_id,
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=misfire_grace_for(interval_s),
            next_run_time=_now() + timedelta(seconds=first),
        )

    def _cancel(self, job_id: str) -> bool:
        try:
            self.aps.remove_job(job_id)
        except JobLookupError:
            return False
        return True

    def has_job(self, name: str) -> bool:
        return self.aps.get_job(name) is not None

    def _beat(self) -> None:
        self.last_heartbeat = self.monotonic()

    async def _heartbeat(self) -> None:
        self._beat()

    def heartbeat_age(self) -> float | None:
        if self.last_heartbeat is None:
            return None
        return self.monotonic() - self.last_heartbeat

    def healthy(self) -> bool:
        """The scheduler runs and its heartbeat job fired recently (so the event loop turns too)."""
        age = self.heartbeat_age()
        return self.running and age is not None and age < self.heartbeat_s * HEARTBEAT_STALE_PERIODS

    # -- checks ----------------------------------------------------------------------------------------

    def add(self, check: Check, first_run_in_s: float = 0.0) -> None:
        name = check.name
        if name in self.checks:
            self.remove(name)
        self.checks[name] = check
        self.store.declare(name, probe_labels(check), check.zero_samples())
        interval = check.settings.interval_s
        self._add(name, self._check_job, interval, first_run_in_s, jitter_for(interval), args=(name,))
        if name in self._busy:  # the replaced check's run is still going: APScheduler would skip this one's first
            self._again.add(name)
        self.runner.start(check)  # a broken event source is logged there and does not stop the daemon

    def remove(self, name: str, forget: bool = True) -> None:
        check = self.checks.pop(name, None)
        self._cancel(name)
        self._again.discard(name)
        if check is not None:
            self.runner.stop(check)
        if forget:
            self.store.forget(name)

    def add_job(
        self, job_id: str, func: Callable[[], Any], interval_s: float, first_run_in_s: float | None = None
    ) -> None:
        """A non-check periodic job (the textfile writer): a plain function, run in a thread; its first run
        ``first_run_in_s`` from now (None: one interval)."""

        def guarded() -> None:
            try:
                func()
            except Exception as exc:  # a job's failure is logged, and its next run still comes
                log.error("job_failed", job=job_id, error=f"{type(exc).__name__}: {exc}")

        self._add(job_id, guarded, interval_s, first_run_in_s)

    def remove_job(self, job_id: str) -> None:
        self._cancel(job_id)

    def wake(self, name: str) -> None:
        """Run the check now; callable from any thread (an event source's follower)."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is stopping
            loop.call_soon_threadsafe(self._wake, name)

    def _wake(self, name: str) -> None:
        if name not in self.checks or not self.running:
            return
        if name in self._busy:  # a run is going: one more after it sees this event too
            self._again.add(name)
            return
        self._run_now(name)

    def _run_now(self, name: str) -> None:
        with contextlib.suppress(JobLookupError):  # removed meanwhile
            self.aps.modify_job(name, next_run_time=_now())

    def _job_ended(self, event: JobExecutionEvent) -> None:
        """APScheduler counts the run as ended (so ``max_instances`` lets the next one in): run again if woken."""
        if event.job_id in self._again and event.job_id not in self._busy:
            self._again.discard(event.job_id)
            if self.running:
                self._run_now(event.job_id)

    async def _check_job(self, name: str) -> None:
        self._busy.add(name)
        try:
            await self._run(name)
        except asyncio.CancelledError:
            if self.running:
                raise
            # The scheduler shut down with this run going: the daemon is stopping, nothing to report.
        except Exception as exc:  # a job's failure is logged, and its next run still comes
            log.error("job_failed", job=name, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._busy.discard(name)

    async def _run(self, name: str) -> None:
        check = self.checks.get(name)
        if check is None:
            return
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

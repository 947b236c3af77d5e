"""One job per check on the event loop: its own interval, never two runs at once, missed runs coalesced, jitter.

Runs go through ``checks.base.CheckRunner`` (timeout, exception -> UNKNOWN, duration); results go to the
store; a status change is logged once (one line per transition, not per run). A check is started (through the
runner, ``Check.start``) when it is added and stopped when it is removed or the scheduler shuts down. An event
source asks for a run now with ``wake(name)`` (from any thread; the daemon hands it to checks as
``env.fleet.wake``): the event is then in /metrics and /state within milliseconds instead of at the next interval.
Wake-ups coalesce (at most one more run queued behind a running one), and a wake run and the scheduled run take
turns, never two runs of one check at once.
A heartbeat job proves the scheduler is turning: ``/healthz`` and the systemd watchdog read it.

A job is one asyncio task that sleeps to its next fire time, awaits the run, and then sleeps to the first fire time
after the run ended: what APScheduler did here with ``coalesce`` and ``max_instances=1`` (fires that fall inside a
run are skipped, never queued), without its process-pool executor, job stores, time zones and ``multiprocessing``
(~1 MiB of the idle daemon's memory, ``benchmarks/daemon_memory.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import random
import time
from collections.abc import Callable
from typing import Any

from msgspec import Struct

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


def jitter_for(interval_s: float) -> float:
    """Up to 10% of the interval, at most 5 s: spreads runs without making cheap checks irregular."""
    return min(interval_s * 0.1, MAX_JITTER_S)


def next_fire(base: float, interval_s: float, now: float) -> float:
    """The first time ``base + k * interval_s`` (k >= 1) after ``now``: fires missed during a run coalesce."""
    if now < base + interval_s:
        return base + interval_s
    return base + (math.floor((now - base) / interval_s) + 1) * interval_s


class Job(Struct):
    """A periodic job: ``func`` runs on the loop (awaited if it returns an awaitable), or in a thread."""

    func: Callable[[], Any]
    interval_s: float
    jitter_s: float = 0.0
    first_run_in_s: float | None = None  # None: one interval after the start
    in_thread: bool = False
    task: asyncio.Task[None] | None = None
    busy: bool = False
    stopped: bool = False

    def stop(self) -> None:
        """No more runs; a run in progress finishes (its result is dropped by whoever removed the job)."""
        self.stopped = True
        if self.task is not None and not self.busy:
            self.task.cancel()
        self.task = None

    async def call(self) -> None:
        if self.in_thread:
            await asyncio.to_thread(self.func)
            return
        result = self.func()
        if inspect.isawaitable(result):
            await result

    async def loop(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        base = loop.time() + (self.interval_s if self.first_run_in_s is None else self.first_run_in_s)
        fire = base
        while not self.stopped:
            await asyncio.sleep(max(0.0, fire - loop.time()))
            self.busy = True
            try:
                await self.call()
            except Exception as exc:  # a job's failure is logged, and its next run still comes
                log.error("job_failed", job=name, error=f"{type(exc).__name__}: {exc}")
            finally:
                self.busy = False
            base = next_fire(base, self.interval_s, loop.time())
            fire = base + (random.uniform(0, self.jitter_s) if self.jitter_s else 0.0)


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
        self.jobs: dict[str, Job] = {}
        self.running = False

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.running = True
        self._heartbeat()
        self._add(HEARTBEAT_JOB, Job(self._heartbeat, self.heartbeat_s))
        for name, job in self.jobs.items():
            if job.task is None:
                self._start_job(name, job)

    def shutdown(self) -> None:
        self.runner.stop_all(self.checks.values())
        self.running = False
        for job in self.jobs.values():
            job.stop()

    def _add(self, name: str, job: Job) -> None:
        self._cancel(name)
        self.jobs[name] = job
        if self.running:
            self._start_job(name, job)

    def _start_job(self, name: str, job: Job) -> None:
        assert self._loop is not None
        job.task = self._loop.create_task(job.loop(name), name=f"job:{name}")

    def _cancel(self, name: str) -> bool:
        job = self.jobs.pop(name, None)
        if job is not None:
            job.stop()
        return job is not None

    def has_job(self, name: str) -> bool:
        return name in self.jobs

    def _heartbeat(self) -> None:
        self.last_heartbeat = self.monotonic()

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
        self._add(name, Job(lambda: self._run(name), interval, jitter_for(interval), first_run_in_s))
        self.runner.start(check)  # a broken event source is logged there and does not stop the daemon

    def remove(self, name: str, forget: bool = True) -> None:
        check = self.checks.pop(name, None)
        self._cancel(name)
        if check is not None:
            self.runner.stop(check)
        if forget:
            self.store.forget(name)

    def add_job(self, job_id: str, func: Callable[[], Any], interval_s: float) -> None:
        """A non-check periodic job (the textfile writer): a plain function runs in a thread, as a write that
        blocks on a hung file system must not stop the loop."""
        self._add(job_id, Job(func, interval_s, in_thread=True))

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

"""vLLM's forward progress: when the engine last did work, followed every few seconds while it has work.

/health is answered by the API server, which stays up when the engine is stuck (one tensor-parallel rank waiting
forever in an NCCL collective, a stopped worker): every other rank waits too and no token moves. What cannot stay
still while the engine works are its own counters (``VllmMetrics.progress_marks``: engine steps, generated and
prompt tokens, finished requests, preemptions). The clock below keeps the time of the last reading at which any of
them moved; the follower reads ``/metrics`` every ``progress_poll_s`` while requests are running or waiting (an
idle server is not polled: nothing can stall), and asks the daemon for a run of the check the moment a stall
crosses a threshold, or the moment ``/metrics`` stops answering.

Corroboration from ``/proc``: the engine's processes (titled ``VLLM::EngineCore``, ``VLLM::Worker_TP0`` ... by
vLLM, below the API server that listens on the configured port and of its user) are read at each follower tick,
so the finding says whether they are stopped (SIGSTOP, a debugger), idle (waiting on a peer rank) or spinning a
full core with no progress (a collective that never completes).

By hand::

    watch -n1 "curl -s localhost:8000/metrics | grep -E '^vllm:(iteration_tokens_total_count|num_requests_running)'"
    ss -ltnp 'sport = :8000'                      # the API server's pid
    pstree -plu <that pid>; ps -o pid,user,stat,pcpu,args -p <an engine pid>
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from msgspec import Struct

from dgxdoctor.sources.follower import Follower
from dgxdoctor.sources.procfs import CLK_TCK, ProcessInfo
from dgxdoctor.sources.vllm_api import engine_processes
from dgxdoctor.sources.vllm_metrics import VllmMetrics

STOPPED_STATES = ("T", "t")  # stopped by a signal, stopped by a tracer


class ProgressClock:
    """The time (``monotonic``) of the last reading at which vLLM's engine moved, shared by runs and the follower.

    A reading with no load (nothing running or waiting), the first reading and a reading whose counters differ
    from the previous one all count as progress. The time kept is the reading's, not the moment the counters moved:
    the stall it gives is never longer than the real one (no false alarm from a sparse reading).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: tuple[float | None, ...] | None = None
        self._progress_t: float | None = None
        self._last_t: float | None = None
        self._loaded = False

    def observe(self, t: float, metrics: VllmMetrics) -> None:
        marks = metrics.progress_marks
        with self._lock:
            unknown = all(m is None for m in marks)  # a page without any counter: progress cannot be judged
            moved = self._marks is None or marks != self._marks or unknown
            if moved or not metrics.has_load or self._progress_t is None:
                self._progress_t = t
            self._marks = marks
            self._last_t = max(t, self._last_t or t)
            self._loaded = metrics.has_load

    def reset(self) -> None:
        """The server went away: the next one starts from scratch."""
        with self._lock:
            self._marks = self._progress_t = self._last_t = None
            self._loaded = False

    @property
    def loaded(self) -> bool:
        with self._lock:
            return self._loaded

    def stalled_s(self) -> float | None:
        """Seconds from the last progress to the last reading; 0 when idle; None before any reading."""
        with self._lock:
            if self._progress_t is None or self._last_t is None:
                return None
            return self._last_t - self._progress_t


class EngineProcess(Struct, frozen=True):
    """One of vLLM's model-running processes as ``/proc`` shows it; ``cpu_ratio`` is the share of one CPU used
    since the previous look (None on the first)."""

    pid: int
    title: str
    state: str
    cpu_ratio: float | None

    def describe(self) -> str:
        if self.state in STOPPED_STATES:
            return f"{self.title} (pid {self.pid}) is stopped (state {self.state})"
        cpu = "" if self.cpu_ratio is None else f", {self.cpu_ratio * 100:.0f}% of a CPU"
        return f"{self.title} (pid {self.pid}) state {self.state}{cpu}"


class EngineWatch:
    """Reads the engine processes' state and CPU time; the CPU share is over the time between two looks.

    The engine processes are those of the serving vLLM only (``vllm_api.engine_processes``): below the API server
    that ``api_server`` names (the one listening on the configured port, or the pid file's), of its user. A
    process anyone can title ``VLLM::EngineCore`` and stop is never evidence: with it, any local user made a
    healthy engine ENGINE_HUNG and had root restart vLLM, then the cluster.
    """

    def __init__(
        self, proc_root: Path, monotonic: Callable[[], float], api_server: Callable[[], ProcessInfo | None]
    ) -> None:
        self._proc_root = proc_root
        self._monotonic = monotonic
        self._api_server = api_server
        self._lock = threading.Lock()
        self._ticks: dict[tuple[int, int], tuple[float, int]] = {}  # (pid, start) -> (time, cpu ticks)
        self.latest: tuple[EngineProcess, ...] = ()

    def look(self) -> tuple[EngineProcess, ...]:
        now = self._monotonic()
        seen: list[EngineProcess] = []
        ticks: dict[tuple[int, int], tuple[float, int]] = {}
        with self._lock:
            server = self._api_server()
            for proc in engine_processes(self._proc_root, server) if server is not None else ():
                if proc.stat is None:
                    continue
                key = (proc.pid, proc.stat.start_ticks)
                ticks[key] = (now, proc.stat.cpu_ticks)
                before = self._ticks.get(key)
                ratio = None
                if before is not None and now > before[0]:
                    ratio = (proc.stat.cpu_ticks - before[1]) / CLK_TCK / (now - before[0])
                seen.append(EngineProcess(proc.pid, proc.cmdline[0].split()[0], proc.stat.state, ratio))
            self._ticks = ticks
            self.latest = tuple(seen)
        return self.latest


class ProgressFollower:
    """A thread that reads vLLM's counters every ``poll_s`` while it has work and wakes the check on a stall.

    ``fetch`` reads ``/metrics`` (raising on any failure); ``wake`` asks the daemon for a run now. Each threshold
    wakes once per stall; a failing read wakes once per streak of failures (a dead or stopped API server is then
    judged at once, not at the next interval).
    """

    def __init__(
        self,
        fetch: Callable[[], VllmMetrics],
        clock: ProgressClock,
        engines: EngineWatch,
        monotonic: Callable[[], float],
        poll_s: float,
        thresholds: tuple[float, ...],
        wake: Callable[[], None],
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._fetch = fetch
        self._close = close
        self._clock = clock
        self._engines = engines
        self._monotonic = monotonic
        self._poll_s = poll_s
        self._thresholds = thresholds
        self._wake = wake
        # The shared follower thread; each "wait" is one poll interval and, with work in flight, one tick.
        self._thread: Follower[None] = Follower(
            "vllm-progress", self._wait, lambda _: None, lambda exc: f"{type(exc).__name__}: {exc}", "vllm_progress"
        )
        self._woken: set[float] = set()
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop(timeout_s=self._poll_s + 1.0)
        self._close()

    def _wait(self) -> list[None]:
        self._thread.sleep(self._poll_s)
        if self._clock.loaded and not self._thread.stopping:
            self.tick()
        return []

    def tick(self) -> None:
        """One look: read the counters and the engine processes, wake the check if a threshold was crossed."""
        try:
            metrics = self._fetch()
        except Exception:  # any failure of the read is the check's to judge; the follower only asks for a run
            if not self._failing:
                self._failing = True
                self._wake()
            return
        self._failing = False
        self._clock.observe(self._monotonic(), metrics)
        self._engines.look()
        stalled = self._clock.stalled_s() or 0.0
        if stalled == 0.0:
            self._woken.clear()
            return
        crossed = {t for t in self._thresholds if stalled >= t} - self._woken
        if crossed:
            self._woken |= crossed
            self._wake()

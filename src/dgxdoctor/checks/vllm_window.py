"""The vllm check's memory between ``/metrics`` readings: the latency window, the KV cache period, how long the
queue has waited, when tokens last advanced. State only: ``judge/vllm.py`` decides what it means.
"""

from __future__ import annotations

from collections import deque

from msgspec import Struct

from dgxdoctor.checks.vllm_progress import STOPPED_STATES, EngineProcess, ProgressClock
from dgxdoctor.judge.vllm import Observed
from dgxdoctor.sources.vllm_metrics import VllmMetrics, window_stats


class Reading(Struct, frozen=True):
    t: float  # env.monotonic()
    metrics: VllmMetrics


class MetricsWindow:
    """Readings over ``latency_window_s`` and KV cache usage over ``kv_cache_sustained_s``.

    ``one_shot``: `dgxdoctor check` judges the readings of its own run ("sustained" across the run); the daemon
    needs readings spanning the whole period.
    """

    def __init__(self, latency_window_s: float, kv_cache_sustained_s: float, one_shot: bool) -> None:
        self.latency_window_s = latency_window_s
        self.kv_cache_sustained_s = kv_cache_sustained_s
        self.one_shot = one_shot
        self.readings: deque[Reading] = deque()
        self._kv: deque[tuple[float, float]] = deque()  # (monotonic time, KV cache usage)
        self._waiting_since: float | None = None
        self.progress = ProgressClock()  # also fed by the daemon's follower between runs

    def reset(self) -> None:
        """The server went away: its counters and windows mean nothing for the next one."""
        self.readings.clear()
        self._kv.clear()
        self._waiting_since = None
        self.progress.reset()

    def observe(self, metrics: VllmMetrics, now: float) -> None:
        """Add a reading; keep the window (and one reading older than it, the delta's start)."""
        self.readings.append(Reading(now, metrics))
        horizon = now - self.latency_window_s
        while len(self.readings) > 2 and self.readings[1].t <= horizon:
            self.readings.popleft()
        if metrics.kv_cache_usage is None:
            self._kv.clear()
        else:
            self._kv.append((now, metrics.kv_cache_usage))
            while len(self._kv) > 2 and self._kv[1][0] <= now - self.kv_cache_sustained_s:
                self._kv.popleft()
        if (metrics.num_requests_waiting or 0) > 0:
            self._waiting_since = self._waiting_since if self._waiting_since is not None else now
        else:
            self._waiting_since = None
        self.progress.observe(now, metrics)

    def kv_sustained(self, kv_warn: float) -> tuple[float, float] | None:
        """(mean usage, span) when the KV cache stayed at or above ``kv_warn`` on average, like PromQL's
        ``avg_over_time(vllm:kv_cache_usage_perc[2m]) > 0.9``."""
        if not self._kv:
            return None
        now = self._kv[-1][0]
        # observe() keeps the readings of the period plus the one just before it (its value held until the next).
        window = list(self._kv)
        if not self.one_shot and now - window[0][0] < self.kv_cache_sustained_s:
            return None
        mean = sum(v for _, v in window) / len(window)
        if mean < kv_warn:
            return None
        return mean, now - window[0][0]

    def sustained(self, since: float | None, need_s: float) -> float | None:
        """How long a condition has held, if it has held long enough (one-shot: across the whole run)."""
        if since is None:
            return None
        now = self.readings[-1].t
        held = now - since
        if self.one_shot:
            need_s = now - self.readings[0].t
        return held if held >= need_s else None

    def observed(self, kv_warn: float, waiting_sustained_s: float, engines: tuple[EngineProcess, ...] = ()) -> Observed:
        """The window at its latest reading (call after at least one ``observe``); ``engines`` as evidence."""
        last = self.readings[-1]
        m = last.metrics
        stalled = self.progress.stalled_s() if m.has_load else None
        stats = baseline = None
        if len(self.readings) >= 2:  # one reading has no window: its histograms hold the server's whole life
            oldest = self.readings[0]
            stats = window_stats(m, oldest.metrics, last.t - oldest.t)
            baseline = window_stats(oldest.metrics, None, 0.0).ttft_p99_s
        waiting = self.sustained(self._waiting_since, waiting_sustained_s)
        return Observed(
            m,
            self.kv_sustained(kv_warn),
            waiting,
            stalled,
            stats,
            baseline,
            engines=tuple(e.describe() for e in engines),
            engine_stopped=any(e.state in STOPPED_STATES for e in engines),
        )

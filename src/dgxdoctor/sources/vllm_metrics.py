"""vLLM's ``/metrics`` page -> a VllmMetrics snapshot; latency percentiles over a window of two snapshots. Pure.

Metric names (vLLM 0.32.0, labels ``engine`` and ``model_name``; see docs.vllm.ai "Production Metrics"):

    vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5417     (0..1, despite the name)
    vllm:num_requests_running / vllm:num_requests_waiting              gauges
    vllm:num_preemptions_total, vllm:prompt_tokens_total, vllm:generation_tokens_total   counters
    vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds                    histograms
    vllm:request_success_total{finished_reason="length"}                                   counter
    vllm:iteration_tokens_total_count                    histogram: one observation per engine step

The engine records stats after every step, with or without request output ("We must return the stats even if there
are no request outputs this step", vllm/v1/core/sched/scheduler.py), so ``vllm:iteration_tokens_total``'s count moves
even during a chunked prefill that has produced no token yet: the finest forward-progress signal vLLM exports.

Older releases (the operator tutorial's) named the KV gauge ``vllm:gpu_cache_usage_perc`` and the inter-token
histogram ``vllm:time_per_output_token_seconds``; both generations are read, the newer name first.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.sources.prom_text import (
    Histogram,
    PromSnapshot,
    first_present,
    histogram_delta,
    histogram_quantile,
    parse_prom_text,
)

KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
REQUESTS_WAITING = ("vllm:num_requests_waiting",)
REQUESTS_RUNNING = ("vllm:num_requests_running",)
PREEMPTIONS = ("vllm:num_preemptions_total",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
REQUESTS_FINISHED = ("vllm:request_success_total",)
ENGINE_STEPS = ("vllm:iteration_tokens_total",)  # a histogram: its count is the number of engine steps
# Every name above: a page with none of them is not vLLM's.
ALL_NAMES = (
    *KV_CACHE_USAGE,
    *REQUESTS_WAITING,
    *REQUESTS_RUNNING,
    *PREEMPTIONS,
    *PROMPT_TOKENS,
    *GENERATION_TOKENS,
)


class NotVllmMetrics(ValueError):
    """Valid Prometheus text, but none of vLLM's metrics in it (wrong port, another exporter)."""


class VllmMetrics(Struct, frozen=True):
    """One scrape. A value missing from the page is None (absent, never zero)."""

    kv_cache_usage: float | None  # 0..1, the fullest engine's
    num_requests_waiting: float | None
    num_requests_running: float | None
    preemptions_total: float | None
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    ttft: Histogram | None
    itl: Histogram | None
    model_names: tuple[str, ...] = ()
    kv_cache_metric: str | None = None  # which generation's name the page used
    requests_finished_total: float | None = None
    engine_steps_total: float | None = None

    @property
    def tokens_total(self) -> float | None:
        """Prompt + generated tokens: it advances whenever the engine does any work (prefill or decode)."""
        parts = [v for v in (self.prompt_tokens_total, self.generation_tokens_total) if v is not None]
        return sum(parts) if parts else None

    @property
    def progress_marks(self) -> tuple[float | None, ...]:
        """Every counter that moves when the engine works: a change in any of them is forward progress."""
        return (
            self.engine_steps_total,
            self.generation_tokens_total,
            self.prompt_tokens_total,
            self.requests_finished_total,
            self.preemptions_total,
        )

    @property
    def has_load(self) -> bool:
        """Requests are running or waiting: the engine ought to be producing tokens."""
        return (self.num_requests_waiting or 0) > 0 or (self.num_requests_running or 0) > 0


def vllm_metrics_from_snapshot(snap: PromSnapshot) -> VllmMetrics:
    if not any(name in snap for name in ALL_NAMES):
        shown = ", ".join(snap.names()[:5])
        raise NotVllmMetrics(f"no vLLM metrics (vllm:*) in the payload; it has {shown} ...")
    return VllmMetrics(
        kv_cache_usage=snap.max(*KV_CACHE_USAGE),
        num_requests_waiting=snap.sum(*REQUESTS_WAITING),
        num_requests_running=snap.sum(*REQUESTS_RUNNING),
        preemptions_total=snap.sum(*PREEMPTIONS),
        prompt_tokens_total=snap.sum(*PROMPT_TOKENS),
        generation_tokens_total=snap.sum(*GENERATION_TOKENS),
        ttft=snap.histogram(*TTFT),
        itl=snap.histogram(*ITL),
        model_names=tuple(snap.label_values("model_name", *ALL_NAMES)),
        kv_cache_metric=first_present(snap, KV_CACHE_USAGE),
        requests_finished_total=snap.sum(*REQUESTS_FINISHED),
        engine_steps_total=_count(snap.histogram(*ENGINE_STEPS)),
    )


def _count(hist: Histogram | None) -> float | None:
    return None if hist is None else hist.count


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """Parse a vLLM ``/metrics`` payload. Raises PromTextError (not Prometheus text) or NotVllmMetrics."""
    return vllm_metrics_from_snapshot(parse_prom_text(text))


class WindowStats(Struct, frozen=True):
    """What happened between two scrapes: percentiles from bucket deltas, counter increases."""

    span_s: float
    ttft_p99_s: float | None
    ttft_count: float
    itl_p99_s: float | None
    preemptions: float | None
    tokens: float | None


def _increase(newer: float | None, older: float | None) -> float | None:
    if newer is None or older is None:
        return None
    # A counter that went down was reset (server restarted): everything since is the newer value.
    return newer - older if newer >= older else newer


def window_stats(newer: VllmMetrics, older: VllmMetrics | None, span_s: float, quantile: float = 0.99) -> WindowStats:
    """Latency percentiles and counter increases between ``older`` and ``newer`` (None: since server start)."""
    ttft = histogram_delta(newer.ttft, older.ttft if older else None) if newer.ttft else None
    itl = histogram_delta(newer.itl, older.itl if older else None) if newer.itl else None
    return WindowStats(
        span_s=span_s,
        ttft_p99_s=histogram_quantile(quantile, ttft) if ttft else None,
        ttft_count=ttft.count if ttft else 0.0,
        itl_p99_s=histogram_quantile(quantile, itl) if itl else None,
        preemptions=_increase(newer.preemptions_total, older.preemptions_total if older else 0.0),
        tokens=_increase(newer.tokens_total, older.tokens_total if older else 0.0),
    )

"""Benchmark verdicts: the knee of a concurrency sweep, and a run against its saved baseline.

The knee (the runbook: "the step where throughput stops rising and TPOT clearly worsens is this machine's working
range"): walking up the sweep, the first step from concurrency C to the next one where output throughput grows by
less than ``min_gain`` (default 10 %) while P99 TPOT grows by more than ``max_tpot_growth`` (default 20 %). C is the
knee; ``--max-num-seqs C`` keeps the server there. A sweep with no such step has its knee beyond the largest
concurrency tried: the highest one is reported with that said, so the sweep can be extended.

The weekly check compares one run with the baseline's run at the same concurrency and settings: output throughput
down by more than ``throughput_tolerance`` (default 10 %), or P99 TPOT / TTFT up by more than their tolerances
(20 % / 50 %), is a WARNING; failed requests are a WARNING too.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from msgspec import Struct

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.vllm_bench import BenchPoint

DEFAULT_MIN_GAIN = 0.10
DEFAULT_MAX_TPOT_GROWTH = 0.20


class Knee(Struct, frozen=True):
    concurrency: int
    found: bool  # False: throughput still grew at the largest concurrency tried
    reason: str

    @property
    def max_num_seqs(self) -> int:
        return self.concurrency


def _tpot(point: BenchPoint) -> float:
    """P99 TPOT, the mean where the run did not save percentiles."""
    return point.p99_tpot_ms if point.p99_tpot_ms is not None else point.mean_tpot_ms


def find_knee(
    points: Sequence[BenchPoint], min_gain: float = DEFAULT_MIN_GAIN, max_tpot_growth: float = DEFAULT_MAX_TPOT_GROWTH
) -> Knee:
    """The knee of a sweep (see the module docstring). ValueError for fewer than two concurrencies."""
    by_c = sorted({p.concurrency: p for p in points}.values(), key=lambda p: p.concurrency)
    if len(by_c) < 2:
        raise ValueError("a knee needs results at two or more concurrencies")
    for low, high in itertools.pairwise(by_c):
        if low.output_throughput <= 0 or _tpot(low) <= 0:
            continue
        gain = high.output_throughput / low.output_throughput - 1
        worse = _tpot(high) / _tpot(low) - 1
        if gain < min_gain and worse > max_tpot_growth:
            return Knee(
                low.concurrency,
                True,
                f"from concurrency {low.concurrency} to {high.concurrency} output throughput changed {gain:+.0%} "
                f"(under {min_gain:.0%}) while P99 TPOT changed {worse:+.0%} (over {max_tpot_growth:.0%})",
            )
    best = max(by_c, key=lambda p: p.output_throughput)
    top = by_c[-1]
    return Knee(
        top.concurrency,
        False,
        f"no knee up to concurrency {top.concurrency}: throughput kept growing by {min_gain:.0%} or more per step, or "
        f"TPOT held within {max_tpot_growth:.0%} (peak {best.output_throughput:.1f} tok/s at {best.concurrency}); "
        "extend the sweep",
    )


class Tolerances(Struct, frozen=True):
    throughput: float = 0.10
    tpot: float = 0.20
    ttft: float = 0.50


def compare_to_baseline(current: BenchPoint, baseline: BenchPoint, tol: Tolerances) -> list[Finding]:
    """Findings for a run against the baseline's run at the same concurrency (empty when within tolerance)."""
    findings: list[Finding] = []
    subject = f"concurrency {current.concurrency}"
    remedy = (
        "compare with the baseline's settings (model, vLLM and driver versions, serve flags): run dgxdoctor bench "
        "for the full sweep, check both nodes' GPUs (clocks, thermals, XIDs), the IB error counters and the NCCL "
        "bandwidth (dgxdoctor check --only nccl) in the next maintenance window"
    )
    if baseline.output_throughput > 0:
        change = current.output_throughput / baseline.output_throughput - 1
        if change < -tol.throughput:
            findings.append(
                Finding(
                    "BENCH_THROUGHPUT_REGRESSION",
                    Status.WARNING,
                    f"output throughput {current.output_throughput:.1f} tok/s is {-change:.0%} below the baseline's "
                    f"{baseline.output_throughput:.1f} (tolerance {tol.throughput:.0%})",
                    subject,
                    remedy=remedy,
                )
            )
    for code, what, now, then, limit in (
        ("BENCH_TPOT_REGRESSION", "P99 TPOT", current.p99_tpot_ms, baseline.p99_tpot_ms, tol.tpot),
        ("BENCH_TTFT_REGRESSION", "P99 TTFT", current.p99_ttft_ms, baseline.p99_ttft_ms, tol.ttft),
    ):
        if now is not None and then is not None and then > 0 and now / then - 1 > limit:
            findings.append(
                Finding(
                    code,
                    Status.WARNING,
                    f"{what} {now:.1f} ms is {now / then - 1:.0%} above the baseline's {then:.1f} ms "
                    f"(tolerance {limit:.0%})",
                    subject,
                    remedy=remedy,
                )
            )
    if current.failed:
        findings.append(
            Finding(
                "BENCH_REQUESTS_FAILED",
                Status.WARNING,
                f"{current.failed} of {current.failed + current.completed} benchmark requests failed",
                subject,
                remedy="read the vLLM log for the failed requests (timeouts, OOM, aborted by preemption)",
            )
        )
    return findings

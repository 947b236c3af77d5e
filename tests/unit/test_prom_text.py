"""prom_text: parsing real vLLM /metrics pages, sums/maxes over label sets, histograms and PromQL quantiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dgxdoctor.sources.prom_text import (
    Histogram,
    PromTextError,
    histogram_delta,
    histogram_quantile,
    parse_prom_text,
)


def test_parses_a_real_vllm_page(fixtures: Path) -> None:
    snap = parse_prom_text((fixtures / "vllm" / "metrics-0.32.0-after-load.txt").read_text())
    assert snap.sum("vllm:num_preemptions_total") == 12.0
    assert snap.max("vllm:kv_cache_usage_perc") == 0.0
    assert snap.label_values("model_name", "vllm:num_requests_running") == ["tiny"]
    ttft = snap.histogram("vllm:time_to_first_token_seconds")
    assert ttft is not None
    assert ttft.buckets[-1][0] == math.inf
    assert ttft.count == snap.sum("vllm:time_to_first_token_seconds_count")
    # cumulative: never decreasing
    counts = [c for _, c in ttft.buckets]
    assert counts == sorted(counts)


def test_first_name_present_wins_and_absent_is_none() -> None:
    text = 'new_name{engine="0"} 0.25\nold_name{engine="0"} 0.5\n'
    snap = parse_prom_text(text)
    assert snap.max("new_name", "old_name") == 0.25
    assert snap.max("missing", "old_name") == 0.5
    assert snap.max("missing") is None
    assert snap.sum("missing") is None
    assert snap.histogram("missing") is None


def test_sum_and_max_over_engines() -> None:
    text = 'w{engine="0"} 3\nw{engine="1"} 4\nkv{engine="0"} 0.2\nkv{engine="1"} 0.95\n'
    snap = parse_prom_text(text)
    assert snap.sum("w") == 7
    assert snap.max("kv") == 0.95
    assert snap.sum("w", match={"engine": "1"}) == 4


def test_histogram_buckets_add_up_across_label_sets() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_bucket{engine="0",le="0.1"} 1\nh_bucket{engine="0",le="+Inf"} 2\nh_sum{engine="0"} 0.3\n'
        'h_count{engine="0"} 2\n'
        'h_bucket{engine="1",le="0.1"} 3\nh_bucket{engine="1",le="+Inf"} 3\nh_sum{engine="1"} 0.1\n'
        'h_count{engine="1"} 3\n'
    )
    hist = parse_prom_text(text).histogram("h")
    assert hist == Histogram(((0.1, 4.0), (math.inf, 5.0)), pytest.approx(0.4))


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("<html><body>Not Found</body></html>", "not Prometheus text"),
        ('{"detail": "Not Found"}', "not Prometheus text"),
        ("vllm:num_requests_waiting{} notanumber\n", "not valid Prometheus text"),
        ("# HELP only comments\n", "no samples"),
    ],
)
def test_bad_payloads_say_what_is_wrong(payload: str, expected: str) -> None:
    with pytest.raises(PromTextError, match=expected):
        parse_prom_text(payload)


def test_histogram_without_inf_bucket_is_an_error() -> None:
    snap = parse_prom_text('h_bucket{le="0.1"} 1\nh_bucket{le="1"} 2\n')
    with pytest.raises(PromTextError, match=r"\+Inf"):
        snap.histogram("h")


# Quantiles, checked against PromQL's histogram_quantile (promql/quantile.go bucketQuantile) by hand:
# buckets le=0.1:10, 0.5:60, 1:90, +Inf:100.
HIST = Histogram(((0.1, 10.0), (0.5, 60.0), (1.0, 90.0), (math.inf, 100.0)))


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.05, 0.05),  # rank 5 in the first bucket: 0 + 0.1 * 5/10
        (0.5, 0.42),  # rank 50: 0.1 + 0.4 * (50-10)/50
        (0.9, 1.0),  # rank 90: the top of the 1.0 bucket
        (0.99, 1.0),  # rank 99 falls in +Inf: the largest finite bound
    ],
)
def test_quantile_interpolates_like_promql(q: float, expected: float) -> None:
    assert histogram_quantile(q, HIST) == pytest.approx(expected)


def test_quantile_of_empty_histogram_is_none() -> None:
    assert histogram_quantile(0.99, Histogram(((0.1, 0.0), (math.inf, 0.0)))) is None
    assert histogram_quantile(0.99, Histogram(((math.inf, 5.0),))) is None
    with pytest.raises(ValueError, match="quantile"):
        histogram_quantile(1.5, HIST)


def test_delta_between_scrapes_and_counter_reset() -> None:
    older = Histogram(((0.1, 5.0), (0.5, 10.0), (math.inf, 10.0)), 2.0)
    newer = Histogram(((0.1, 5.0), (0.5, 12.0), (math.inf, 20.0)), 9.0)
    delta = histogram_delta(newer, older)
    assert delta.buckets == ((0.1, 0.0), (0.5, 2.0), (math.inf, 10.0))
    assert delta.sum == 7.0
    # the 10 new observations: 2 in (0.1, 0.5], 8 above 0.5; rank 5 lies in +Inf -> the largest finite bound
    assert histogram_quantile(0.5, delta) == 0.5
    # the server restarted: the newer scrape is everything since
    restarted = Histogram(((0.1, 1.0), (0.5, 1.0), (math.inf, 1.0)), 0.05)
    assert histogram_delta(restarted, newer) == restarted
    assert histogram_delta(newer, None) == newer

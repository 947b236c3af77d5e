"""vllm_metrics: VllmMetrics from real vLLM 0.32.0 pages, both metric-name generations, window statistics."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.sources.prom_text import PromTextError
from dgxdoctor.sources.vllm_metrics import NotVllmMetrics, parse_vllm_metrics, window_stats


def load(fixtures: Path, name: str) -> str:
    return (fixtures / "vllm" / name).read_text()


def test_full_kv_cache_page(fixtures: Path) -> None:
    m = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-full-kv.txt"))
    assert m.kv_cache_usage == 1.0
    assert m.kv_cache_metric == "vllm:kv_cache_usage_perc"
    assert m.num_requests_waiting == 21.0
    assert m.num_requests_running == 3.0
    assert m.preemptions_total == 3.0
    assert m.model_names == ("tiny",)
    assert m.has_load


def test_idle_page_has_no_latency_yet(fixtures: Path) -> None:
    m = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-idle.txt"))
    assert m.kv_cache_usage == 0.0
    assert not m.has_load
    assert m.ttft is not None and m.ttft.count == 0
    stats = window_stats(m, None, 0.0)
    assert stats.ttft_p99_s is None  # no observation: absent, never zero
    assert stats.itl_p99_s is None


def test_after_load_percentiles(fixtures: Path) -> None:
    m = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-after-load.txt"))
    stats = window_stats(m, None, 0.0)
    assert stats.ttft_count == 16  # the 16 requests served since start
    assert stats.ttft_p99_s == pytest.approx(9.9)  # in the (7.5, 10] bucket, interpolated
    assert stats.itl_p99_s is not None and 0 < stats.itl_p99_s < 0.1
    assert stats.preemptions == 12


def test_window_between_two_real_pages(fixtures: Path) -> None:
    # the same server, 12 more requests later
    older = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-after-load.txt"))
    newer = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-engine-stopped.txt"))
    assert older.tokens_total is not None and newer.tokens_total is not None
    stats = window_stats(newer, older, 30.0)
    assert stats.tokens == newer.tokens_total - older.tokens_total
    assert stats.span_s == 30.0


def test_counter_reset_counts_from_zero(fixtures: Path) -> None:
    before_restart = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-after-load.txt"))
    after_restart = parse_vllm_metrics(load(fixtures, "metrics-0.32.0-idle.txt"))
    stats = window_stats(after_restart, before_restart, 30.0)
    assert stats.preemptions == 0.0
    assert stats.ttft_count == 0


# Lines of a pre-0.10 server, names as listed for vLLM v0 in vLLM's docs/design/v1/metrics.md ("v0 Metrics").
OLD_GENERATION = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="glm-5.3"} 0.93
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="glm-5.3"} 5.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="glm-5.3"} 64.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="glm-5.3"} 900.0
vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="glm-5.3"} 1000.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="glm-5.3"} 1000.0
vllm:time_per_output_token_seconds_count{model_name="glm-5.3"} 1000.0
vllm:time_per_output_token_seconds_sum{model_name="glm-5.3"} 30.0
"""


def test_older_metric_names_are_read() -> None:
    m = parse_vllm_metrics(OLD_GENERATION)
    assert m.kv_cache_usage == 0.93
    assert m.kv_cache_metric == "vllm:gpu_cache_usage_perc"
    assert m.itl is not None and m.itl.count == 1000
    assert m.preemptions_total is None  # absent, not zero


def test_transition_releases_expose_both_names_without_double_counting() -> None:
    # vLLM 0.10.x exposes vllm:kv_cache_usage_perc and the deprecated vllm:gpu_cache_usage_perc side by side.
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
    )
    m = parse_vllm_metrics(text)
    assert m.kv_cache_usage == 0.4
    assert m.kv_cache_metric == "vllm:kv_cache_usage_perc"


def test_data_parallel_engines_sum_queues_and_max_the_cache() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.97\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
    )
    m = parse_vllm_metrics(text)
    assert m.kv_cache_usage == 0.97
    assert m.num_requests_waiting == 5.0


def test_not_vllm_and_not_prometheus() -> None:
    with pytest.raises(NotVllmMetrics, match="no vLLM metrics"):
        parse_vllm_metrics("node_load1 0.5\nprocess_cpu_seconds_total{} 3\n")
    with pytest.raises(PromTextError):
        parse_vllm_metrics("<!doctype html><title>Grafana</title>")

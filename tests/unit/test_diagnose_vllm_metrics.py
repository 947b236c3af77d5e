"""`dgxdoctor diagnose` of pasted vLLM /metrics pages (kind vllm-metrics)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from dgxdoctor.diagnose.base import diagnose_text
from dgxdoctor.diagnose.registry import ANALYZERS
from dgxdoctor.diagnose.vllm_metrics import VllmMetricsAnalyzer
from dgxdoctor.result import Status


def text(fixtures: Path, name: str) -> str:
    return (fixtures / "vllm" / f"metrics-0.32.0-{name}.txt").read_text()


def test_detects_vllm_pages_only(fixtures: Path) -> None:
    a = VllmMetricsAnalyzer()
    assert a.detect(text(fixtures, "idle"))
    assert a.detect('vllm:gpu_cache_usage_perc{model_name="m"} 0.3\n')
    assert not a.detect("node_load1 0.5\n")
    assert not a.detect("the vllm:num_requests_waiting metric is described here")


def test_full_kv_cache_page(fixtures: Path) -> None:
    d = diagnose_text(text(fixtures, "full-kv"), ANALYZERS)
    assert d.kind == "vllm-metrics"
    assert d.status is Status.WARNING
    by_code = {f.code: f for f in d.findings}
    assert set(by_code) == {"KV_CACHE_HIGH", "QUEUE_WAITING"}
    assert by_code["KV_CACHE_HIGH"].evidence == 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 1.0'
    assert by_code["QUEUE_WAITING"].evidence == 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 21.0'
    assert all(f.remedy for f in d.findings)
    assert d.data["kv_cache_usage"] == 1.0
    assert d.data["num_requests_waiting"] == 21.0
    assert d.data["num_requests_running"] == 3.0


def test_quiet_page_is_ok_with_its_numbers(fixtures: Path) -> None:
    d = diagnose_text(text(fixtures, "after-load"), ANALYZERS)
    assert d.status is Status.OK
    assert d.findings == ()
    assert d.data["preemptions_total"] == 12.0
    assert d.data["ttft_p99_s"] == 9.9


def test_truncated_paste_is_unknown_not_a_crash(fixtures: Path) -> None:
    broken = text(fixtures, "full-kv")[:2000] + '\nvllm:num_requests_waiting{engine="0" 3\n'
    d = VllmMetricsAnalyzer().analyze(broken)
    assert d.status is Status.UNKNOWN
    assert d.findings[0].code == "METRICS_UNPARSEABLE"


def test_cli_json(fixtures: Path) -> None:
    run = run_cli("diagnose", "--json", str(fixtures / "vllm" / "metrics-0.32.0-full-kv.txt"))
    assert run.returncode == 1, run.stderr
    doc = run.json()["inputs"][0]
    assert doc["kind"] == "vllm-metrics"
    assert doc["data"]["kv_cache_usage"] == 1.0
    assert {f["code"] for f in doc["findings"]} == {"KV_CACHE_HIGH", "QUEUE_WAITING"}

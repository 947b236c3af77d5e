"""`dgxdoctor diagnose` on vLLM logs, Ray logs and nccl-tests output, through the real CLI."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from dgxdoctor.diagnose.base import diagnose_text
from dgxdoctor.diagnose.logs import RayLogAnalyzer, VllmLogAnalyzer
from dgxdoctor.diagnose.registry import ANALYZERS

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_vllm_log_detected_and_diagnosed() -> None:
    text = (FIX / "logs" / "kv_cache_no_memory.log").read_text()
    diagnosis = diagnose_text(text, ANALYZERS)
    assert diagnosis.kind == "vllm-log"
    assert [f.code for f in diagnosis.findings] == ["KV_CACHE_NO_MEMORY"]
    finding = diagnosis.findings[0]
    assert finding.subject == "line 1" and "(3 lines)" in finding.message
    assert diagnosis.data["matches"] == {"KV_CACHE_NO_MEMORY": 3}


def test_ray_log_detected() -> None:
    text = (FIX / "logs" / "ray_worker_died.log").read_text()
    diagnosis = diagnose_text(text, ANALYZERS)
    assert diagnosis.kind == "ray-log"
    assert {f.code for f in diagnosis.findings} == {"RAY_WORKER_DIED"}


def test_detect_is_conservative() -> None:
    assert not VllmLogAnalyzer().detect("hello world\n")
    assert not RayLogAnalyzer().detect("hello world\n")
    assert diagnose_text("hello world\n", ANALYZERS).kind == "unknown"


def test_cli_json_vllm_log_forced_kind() -> None:
    run = run_cli("diagnose", "--kind", "vllm-log", "--json", str(FIX / "logs" / "nccl_timeout.log"))
    assert run.returncode == 2, run.stderr
    (doc,) = run.json()["inputs"]
    assert doc["kind"] == "vllm-log"
    assert doc["findings"][0]["code"] == "NCCL_TIMEOUT"
    assert doc["findings"][0]["evidence"].startswith("[rank0]")
    assert doc["findings"][0]["remedy"]


def test_cli_nccl_tests() -> None:
    run = run_cli("diagnose", "--json", str(FIX / "nccl_tests" / "v218_socket_low.txt"))
    assert run.returncode == 2, run.stderr
    (doc,) = run.json()["inputs"]
    assert doc["kind"] == "nccl-tests"
    assert doc["data"]["avg_busbw_gbps"] == 0.669677
    assert doc["data"]["peak_busbw_gbps"] == 1.06
    assert len(doc["data"]["rows"]) == 8
    assert [f["code"] for f in doc["findings"]] == ["NCCL_TESTS_LOW_BUSBW"]
    ok = run_cli("diagnose", str(FIX / "nccl_tests" / "h200_probe_allreduce.txt"))
    assert ok.returncode == 0 and "nccl-tests, ok" in ok.stdout

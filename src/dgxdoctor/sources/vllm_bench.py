"""vLLM's own benchmark, ``vllm bench serve``, run from the serving environment; its saved results read back.

By hand (the runbook's load test)::

    vllm bench serve --backend openai-chat --model glm-5.3 --base-url http://HOST:8000 \\
        --endpoint /v1/chat/completions --dataset-name random --random-input-len 1024 --random-output-len 256 \\
        --num-prompts 500 --max-concurrency 32 --request-rate inf --save-result --result-dir DIR

The caller names the command that is vLLM's CLI: the serving environment's Python running
``dgxdoctor/probes/vllm_cli.py`` (the ``vllm`` console script fails on CPU builds; see there). Each concurrency is
one run with ``--save-result``; the JSON it writes (keys such as ``output_throughput``, ``p99_tpot_ms``) is parsed
by ``parse_bench_result``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct

from dgxdoctor.records import asdict
from dgxdoctor.sources.commands import CommandRunner

MAX_RESULT_BYTES = 64 * 1024 * 1024  # --save-detailed files hold every request's timings; a plain one is ~2 KiB


class BenchSettings(Struct, frozen=True):
    """One sweep's settings: what ``vllm bench serve`` is told, apart from the concurrency."""

    base_url: str
    model: str | None = None
    tokenizer: str | None = None
    input_len: int = 1024
    output_len: int = 256
    prompts_per_concurrency: int = 4
    min_prompts: int = 16
    num_prompts: int | None = None  # fixed count (the weekly check's 100); overrides the two above
    backend: str = "openai-chat"
    endpoint: str = "/v1/chat/completions"

    def prompts_for(self, concurrency: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.min_prompts, self.prompts_per_concurrency * concurrency)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class BenchPoint(Struct, frozen=True):
    """One concurrency's result, in vLLM's units (milliseconds, tokens/s, requests/s)."""

    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float | None
    mean_ttft_ms: float
    p99_ttft_ms: float | None
    mean_tpot_ms: float
    p99_tpot_ms: float | None
    model: str | None = None
    date: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class BenchResultError(ValueError):
    """A result file that is not ``vllm bench serve --save-result`` output, saying what is missing."""


def _number(data: dict[str, Any], key: str, required: bool = True) -> float | None:
    value = data.get(key)
    if value is None:
        if required:
            raise BenchResultError(f"no {key}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BenchResultError(f"{key} is not a non-negative number: {value!r}")
    return float(value)


def parse_bench_result(data: Any, source: str | None = None) -> BenchPoint:
    """One saved result (a JSON object) -> BenchPoint; BenchResultError naming the missing or bad key."""
    if not isinstance(data, dict):
        raise BenchResultError("not a JSON object")
    concurrency = data.get("max_concurrency")
    if concurrency is None:
        raise BenchResultError("no max_concurrency: the run had no --max-concurrency, so it is not a sweep step")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise BenchResultError(f"max_concurrency is not a positive integer: {concurrency!r}")
    completed = int(_number(data, "completed") or 0)
    return BenchPoint(
        concurrency=concurrency,
        num_prompts=int(_number(data, "num_prompts", False) or completed),
        completed=completed,
        failed=int(_number(data, "failed", False) or 0),
        duration_s=_number(data, "duration") or 0.0,
        request_throughput=_number(data, "request_throughput") or 0.0,
        output_throughput=_number(data, "output_throughput") or 0.0,
        total_token_throughput=_number(data, "total_token_throughput", False),
        mean_ttft_ms=_number(data, "mean_ttft_ms") or 0.0,
        p99_ttft_ms=_number(data, "p99_ttft_ms", False),
        mean_tpot_ms=_number(data, "mean_tpot_ms") or 0.0,
        p99_tpot_ms=_number(data, "p99_tpot_ms", False),
        model=data.get("model_id") if isinstance(data.get("model_id"), str) else None,
        date=data.get("date") if isinstance(data.get("date"), str) else None,
        source=source,
    )


def read_bench_result(path: Path) -> BenchPoint:
    """A result file -> BenchPoint; BenchResultError (with the file named) for anything else.

    ``--append-result`` files hold one JSON object per line: the last line is read."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_RESULT_BYTES + 1)
    except OSError as exc:
        raise BenchResultError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_RESULT_BYTES:
        raise BenchResultError(f"{path}: larger than {MAX_RESULT_BYTES >> 20} MiB")
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = json.loads(text.splitlines()[-1]) if text else None  # --append-result: one object per line
    except (ValueError, RecursionError):
        raise BenchResultError(f"{path}: not a JSON result of vllm bench serve") from None
    try:
        return parse_bench_result(data, str(path))
    except BenchResultError as exc:
        raise BenchResultError(f"{path}: {exc}") from None


def bench_argv(
    vllm: Sequence[str], settings: BenchSettings, concurrency: int, result_dir: Path, filename: str
) -> list[str]:
    """The argv of one sweep step: ``vllm`` (the command that is vLLM's CLI, e.g. the serving Python and
    ``probes/vllm_cli.py``) ``bench serve ...``, results saved to ``result_dir``."""
    argv = [*vllm, "bench", "serve"]
    argv += ["--backend", settings.backend, "--base-url", settings.base_url, "--endpoint", settings.endpoint]
    if settings.model:
        argv += ["--model", settings.model]
    if settings.tokenizer:
        argv += ["--tokenizer", settings.tokenizer]
    argv += ["--dataset-name", "random", "--random-input-len", str(settings.input_len)]
    argv += ["--random-output-len", str(settings.output_len), "--ignore-eos"]
    argv += ["--num-prompts", str(settings.prompts_for(concurrency)), "--max-concurrency", str(concurrency)]
    argv += ["--request-rate", "inf", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    argv += ["--save-result", "--result-dir", str(result_dir), "--result-filename", filename, "--disable-tqdm"]
    return argv


class BenchRunError(RuntimeError):
    """``vllm bench serve`` failed: its exit status and the tail of what it printed."""


def run_step(
    runner: CommandRunner,
    vllm: Sequence[str],
    settings: BenchSettings,
    concurrency: int,
    result_dir: Path,
    timeout_s: float,
    prefix: Sequence[str] = (),
) -> BenchPoint:
    """One concurrency: run vLLM's benchmark (after ``prefix``, e.g. a systemd-run line) and read its result."""
    filename = f"concurrency-{concurrency}.json"
    done = runner([*prefix, *bench_argv(vllm, settings, concurrency, result_dir, filename)], timeout_s=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-800:]
        raise BenchRunError(f"vllm bench serve at concurrency {concurrency} exited {done.returncode}: {tail}")
    return read_bench_result(result_dir / filename)


def run_sweep(
    runner: CommandRunner,
    vllm: Sequence[str],
    settings: BenchSettings,
    concurrencies: Sequence[int],
    result_dir: Path,
    timeout_s: float,
    progress: Callable[[int, int, BenchPoint | None], None] = lambda i, c, p: None,
) -> list[BenchPoint]:
    """Each concurrency in turn; ``progress(i, concurrency, point)`` before (point None) and after each step."""
    points = []
    for i, concurrency in enumerate(concurrencies):
        progress(i, concurrency, None)
        point = run_step(runner, vllm, settings, concurrency, result_dir, timeout_s)
        progress(i, concurrency, point)
        points.append(point)
    return points

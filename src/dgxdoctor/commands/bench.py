"""`dgxdoctor bench` and `bench analyze`: the glue between the sweep (sources), the knee (judge) and the files."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import click
import httpx

from dgxdoctor.checks.bench import BenchCheckSettings, baseline_path, vllm_launcher
from dgxdoctor.commands.bench_report import is_sweep_document, sweep_dict, sweep_text, write_outputs
from dgxdoctor.config import Config
from dgxdoctor.judge.bench import Knee, find_knee
from dgxdoctor.sources.bench_baseline import Baseline, save_baseline, serving_versions, vllm_serve_argv
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout, python_argv
from dgxdoctor.sources.serving_env import find_serving_python
from dgxdoctor.sources.vllm_bench import BenchPoint, BenchResultError, BenchRunError, BenchSettings, read_bench_result
from dgxdoctor.sources.vllm_bench import run_sweep as sweep


def _knee(points: Sequence[BenchPoint], min_gain: float, max_tpot_growth: float) -> Knee | None:
    return find_knee(points, min_gain, max_tpot_growth) if len({p.concurrency for p in points}) >= 2 else None


def _finish(
    points: list[BenchPoint], knee: Knee | None, settings: dict[str, object], out_dir: Path, as_json: bool
) -> None:
    title = f"{settings.get('model') or 'vLLM'}: output throughput and TPOT P99 by concurrency"
    written, why_no_png = write_outputs(out_dir, points, knee, settings, title)
    if as_json:
        click.echo(json.dumps(sweep_dict(points, knee, settings), indent=2))
    else:
        click.echo(sweep_text(points, knee))
        click.echo("")
        click.echo("wrote " + ", ".join(str(p) for p in written))
    if why_no_png:
        click.echo(why_no_png, err=True)


# `bench analyze results/*.json` a second time also matches the sweep.json it wrote: that file is skipped, said.
ANALYSIS_DIR = "analysis"


def _read_results(files: list[Path]) -> list[BenchPoint]:
    points: list[BenchPoint] = []
    for path in files:
        try:
            points.append(read_bench_result(path))
        except BenchResultError as exc:
            if not is_sweep_document(path):
                raise click.UsageError(str(exc)) from None
            click.echo(f"skipped {path}: a sweep written by dgxdoctor, not a vllm bench serve result", err=True)
    if not points:
        raise click.UsageError("no vllm bench serve result among the files")
    return points


def analyze_command(
    files: list[Path], min_gain: float, max_tpot_growth: float, out_dir: Path | None, as_json: bool
) -> int:
    points = _read_results(files)
    knee = _knee(points, min_gain, max_tpot_growth)
    models = sorted({p.model for p in points if p.model})
    _finish(
        points,
        knee,
        {"model": ", ".join(models) or None, "files": [str(f) for f in files]},
        out_dir or files[0].parent / ANALYSIS_DIR,
        as_json,
    )
    return 0


def _serving_python(given: str | None, config: Config) -> str:
    if given:
        return given
    configured = config.check_settings("bench")
    assert isinstance(configured, BenchCheckSettings)
    if configured.serving_python:
        return configured.serving_python
    found = find_serving_python(config.paths.proc_root)
    if found is None:
        raise click.UsageError("no running vLLM process found: pass --serving-python (the Python that has vLLM)")
    return found.exe


def run_sweep_command(
    config: Config,
    concurrencies: list[int],
    *,
    base_url: str,
    model: str | None,
    tokenizer: str | None,
    input_len: int,
    output_len: int,
    num_prompts: int | None,
    prompts_per_concurrency: int,
    serving_python: str | None,
    step_timeout_s: float,
    save_baseline: bool,
    min_gain: float,
    max_tpot_growth: float,
    out_dir: Path | None,
    as_json: bool,
) -> int:
    python = _serving_python(serving_python, config)
    _preflight(config, base_url, python)
    settings = BenchSettings(
        base_url, model, tokenizer, input_len, output_len, prompts_per_concurrency, num_prompts=num_prompts
    )
    out = out_dir or Path(f"bench-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def progress(i: int, concurrency: int, point: BenchPoint | None) -> None:
        step = f"[{i + 1}/{len(concurrencies)}] concurrency {concurrency}"
        if point is None:
            click.echo(f"{step}: {settings.prompts_for(concurrency)} requests ...", err=True)
        else:
            click.echo(
                f"{step}: {point.output_throughput:.1f} tok/s, TPOT P99 {point.p99_tpot_ms or point.mean_tpot_ms:.1f} "
                f"ms, {point.failed} failed ({time.monotonic() - started:.0f} s elapsed)",
                err=True,
            )

    try:
        points = sweep(
            config.environment().run_command,
            vllm_launcher(python),
            settings,
            concurrencies,
            raw,
            step_timeout_s,
            progress,
        )
    except (BenchRunError, BenchResultError, CommandTimeout, CommandNotFound) as exc:
        raise click.ClickException(str(exc)) from None
    knee = _knee(points, min_gain, max_tpot_growth)
    doc = {**settings.to_dict(), "concurrencies": concurrencies, "serving_python": python}
    _finish(points, knee, doc, out, as_json)
    if save_baseline:
        path = _save(config, python, settings, points, knee)
        click.echo(f"baseline saved to {path}", err=True)
    return 0


def _preflight(config: Config, base_url: str, python: str) -> None:
    """Before the first step: something answers at ``base_url`` and ``python`` has vLLM (else a clear error)."""
    env = config.environment()
    try:
        with env.http_client(timeout_s=5.0) as client:
            client.get(base_url.rstrip("/") + "/v1/models")
    except (httpx.HTTPError, ValueError) as exc:
        raise click.ClickException(f"nothing answers at {base_url} ({type(exc).__name__}: {exc})") from None
    probe = python_argv(python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)")
    try:
        done = env.run_command(probe, timeout_s=60.0)
    except (CommandNotFound, CommandTimeout, OSError) as exc:
        raise click.ClickException(f"cannot run the serving Python {python}: {exc}") from None
    if done.returncode != 0:
        raise click.ClickException(f"{python} has no vLLM: pass --serving-python, the Python that runs vLLM")


def _save(config: Config, python: str, settings: BenchSettings, points: list[BenchPoint], knee: Knee | None) -> Path:
    configured = config.check_settings("bench")
    assert isinstance(configured, BenchCheckSettings)
    env = config.environment()
    path = baseline_path(configured, env)
    baseline = Baseline(
        saved_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        settings=settings,
        points=tuple(sorted(points, key=lambda p: p.concurrency)),
        versions=serving_versions(env.run_command, python),
        serve_argv=vllm_serve_argv(env.proc_root, env.serving_uid),
        knee=knee.concurrency if knee is not None else None,
    )
    try:
        save_baseline(path, baseline)
    except OSError as exc:
        raise click.ClickException(f"cannot write the baseline {path}: {exc}") from None
    return path

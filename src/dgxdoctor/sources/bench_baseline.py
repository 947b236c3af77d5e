"""The benchmark baseline: a sweep's results with everything needed to reproduce them, as one JSON file.

The runbook: "a benchmark record carries its date, model version, flag combination and figures; '600+ once' alone
cannot be reproduced". So a baseline holds the date, the sweep's settings, the serving stack's versions (from the
serving Python), the running vLLM's command line (from procfs) and each concurrency's results. Written atomically
(temporary file + rename); ``cat /var/lib/dgxdoctor/bench-baseline.json`` shows it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct, field
from msgspec.structs import fields

from dgxdoctor.sources.commands import CommandNotFound, CommandRunner, CommandTimeout
from dgxdoctor.sources.procfs import iter_processes, runs_package, trusted_process
from dgxdoctor.sources.redact import redact_argv
from dgxdoctor.sources.serving_env import PROBE, parse_probe_output
from dgxdoctor.sources.statefile import atomic_write
from dgxdoctor.sources.vllm_bench import BenchPoint, BenchResultError, BenchSettings, parse_bench_result

FORMAT = 1
MAX_BASELINE_BYTES = 4 * 1024 * 1024


class Baseline(Struct, frozen=True):
    saved_at: str
    settings: BenchSettings
    points: tuple[BenchPoint, ...]
    versions: dict[str, str] = field(default_factory=dict)
    serve_argv: tuple[str, ...] = ()
    knee: int | None = None

    def point_at(self, concurrency: int) -> BenchPoint | None:
        return next((p for p in self.points if p.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "saved_at": self.saved_at,
            "settings": self.settings.to_dict(),
            "versions": self.versions,
            "vllm_serve_argv": list(self.serve_argv),
            "knee_concurrency": self.knee,
            "results": [raw_point(p) for p in self.points],
        }


def raw_point(point: BenchPoint) -> dict[str, Any]:
    """A point in vLLM's own result keys, so a baseline's results read back with the same parser."""
    return {
        "max_concurrency": point.concurrency,
        "num_prompts": point.num_prompts,
        "completed": point.completed,
        "failed": point.failed,
        "duration": point.duration_s,
        "request_throughput": point.request_throughput,
        "output_throughput": point.output_throughput,
        "total_token_throughput": point.total_token_throughput,
        "mean_ttft_ms": point.mean_ttft_ms,
        "p99_ttft_ms": point.p99_ttft_ms,
        "mean_tpot_ms": point.mean_tpot_ms,
        "p99_tpot_ms": point.p99_tpot_ms,
        "model_id": point.model,
        "date": point.date,
    }


class BaselineError(ValueError):
    """A baseline file that cannot be used, naming the file and what is wrong."""


def _settings(data: Any) -> BenchSettings:
    if not isinstance(data, dict) or not isinstance(data.get("base_url"), str):
        raise BaselineError("settings.base_url missing")
    known = {f.name for f in fields(BenchSettings)}
    try:
        return BenchSettings(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise BaselineError(f"settings: {exc}") from None


def parse_baseline(data: Any) -> Baseline:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(f"not a dgxdoctor bench baseline (format {FORMAT})")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise BaselineError("no results")
    try:
        points = tuple(parse_bench_result(r) for r in results)
    except BenchResultError as exc:
        raise BaselineError(f"results: {exc}") from None
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    argv = data.get("vllm_serve_argv") if isinstance(data.get("vllm_serve_argv"), list) else []
    knee = data.get("knee_concurrency")
    return Baseline(
        saved_at=str(data.get("saved_at", "")),
        settings=_settings(data.get("settings")),
        points=points,
        versions={str(k): str(v) for k, v in (versions or {}).items()},
        serve_argv=tuple(str(a) for a in argv or []),
        knee=knee if isinstance(knee, int) and not isinstance(knee, bool) else None,
    )


def load_baseline(path: Path) -> Baseline | None:
    """The baseline at ``path``; None when there is none (the check stays off); BaselineError when unusable."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BASELINE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BASELINE_BYTES:
        raise BaselineError(f"{path}: larger than {MAX_BASELINE_BYTES >> 20} MiB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise BaselineError(f"{path}: not JSON") from None
    try:
        return parse_baseline(data)
    except BaselineError as exc:
        raise BaselineError(f"{path}: {exc}") from None


def save_baseline(path: Path, baseline: Baseline) -> None:
    """Write atomically (``atomic_write``): a reader never sees half a baseline; errors raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(baseline.to_dict(), indent=2) + "\n").encode("utf-8"))


def serving_versions(runner: CommandRunner, python: str) -> dict[str, str]:
    """vLLM, torch, Ray, NCCL and Python versions of the serving environment (empty when the probe fails)."""
    try:
        done = runner([python, "-c", PROBE], timeout_s=60)
        return parse_probe_output(done.stdout) if done.returncode == 0 else {}
    except (CommandNotFound, CommandTimeout, ValueError):
        return {}


def vllm_serve_argv(proc_root: Path, serving_uid: int | None = None) -> tuple[str, ...]:
    """The command line of the vLLM API server running on this node (the flags behind the figures), if any; of
    root, dgxdoctor's user or ``[node] serving_user`` (``procfs.trusted_process``)."""
    for proc in iter_processes(proc_root):
        argv: Sequence[str] = proc.cmdline or ()
        if (
            argv
            and runs_package(argv, "vllm")
            and any(a in ("serve", "vllm.entrypoints.openai.api_server") for a in argv)
            and trusted_process(proc.uid, None, serving_uid)
        ):
            return redact_argv(argv)  # it is saved in the baseline and the report: never vLLM's --api-key
    return ()

"""`bench`: the runbook's weekly check, "run a small benchmark (100 requests) and compare with the baseline".

By hand: ``dgxdoctor bench --concurrency 32 --num-prompts 100`` and compare with the saved sweep, or
``vllm bench serve ... --num-prompts 100 --max-concurrency 32`` against the figures written down last time.

Off until a baseline exists (``dgxdoctor bench --save-baseline`` writes it, with its settings). Then, in the daemon,
it runs only inside a maintenance window and at most once per ``period_s`` (a week): ``vllm bench serve`` with the
baseline's model, lengths and base URL, ``num_prompts`` requests at the baseline's knee concurrency, compared with
the baseline's result at that concurrency (``judge/bench.py``: throughput, P99 TPOT and TTFT against tolerances).
Between runs the last run's verdict is repeated from the state directory, so the status holds all week and across
restarts; ``dgxdoctor check`` shows it too and never starts a benchmark outside that schedule.
``dgxdoctor bench compare`` runs the comparison at once, window or not.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, ClassVar

from msgspec import Meta, field
from msgspec.structs import replace

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.checks.nccl_guard import in_window, parse_window
from dgxdoctor.environment import Environment
from dgxdoctor.judge.bench import Tolerances, compare_to_baseline
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.bench_baseline import Baseline, BaselineError, load_baseline, raw_point
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.serving_env import find_serving_python
from dgxdoctor.sources.statefile import StateFile
from dgxdoctor.sources.vllm_bench import (
    BenchPoint,
    BenchResultError,
    BenchRunError,
    BenchSettings,
    parse_bench_result,
    run_step,
)

OUTPUT_THROUGHPUT = MetricSpec(
    "dgxdoctor_bench_output_throughput_tokens_per_second",
    "Output token throughput of the last scheduled benchmark (vllm bench serve).",
)
REQUEST_THROUGHPUT = MetricSpec(
    "dgxdoctor_bench_request_throughput_requests_per_second", "Request throughput of the last scheduled benchmark."
)
TTFT_P99 = MetricSpec("dgxdoctor_bench_ttft_p99_seconds", "P99 time to first token in the last scheduled benchmark.")
TPOT_P99 = MetricSpec(
    "dgxdoctor_bench_tpot_p99_seconds", "P99 time per output token (after the first) in the last scheduled benchmark."
)
BASELINE_THROUGHPUT = MetricSpec(
    "dgxdoctor_bench_baseline_output_throughput_tokens_per_second",
    "Output token throughput of the saved baseline at the benchmark's concurrency.",
)
THROUGHPUT_RATIO = MetricSpec(
    "dgxdoctor_bench_throughput_ratio", "Last benchmark's output throughput divided by the baseline's (1 = equal)."
)
LAST_RUN = MetricSpec("dgxdoctor_bench_last_run_timestamp_seconds", "Unix time the last benchmark finished.")

STATE_FILE = "bench-last.json"
# The last run's format: 1 is 0.1.0's (finished, result) with its version; that release wrote it without (0).
STATE_VERSION = 1


class BenchCheckSettings(CheckSettings, frozen=True):
    """The weekly benchmark against the saved baseline (runs only once a baseline exists)."""

    interval_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="daemon: seconds between looks whether a run is due")
    ] = 3600.0
    timeout_s: Annotated[float, Meta(gt=0, le=DAY_S, description="a benchmark that takes longer is UNKNOWN")] = 1800.0
    period_s: Annotated[
        float, Meta(gt=0, le=31 * DAY_S, description="daemon: at most one benchmark per this many seconds")
    ] = 7 * 86400.0
    maintenance_windows: Annotated[
        list[str],
        Meta(
            description='daemon: UTC windows the benchmark may run in, e.g. ["Sat 02:00-04:00"]; none: never scheduled'
        ),
    ] = field(default_factory=list)
    num_prompts: Annotated[int, Meta(ge=1, le=100000, description="requests per run (the runbook: 100)")] = 100
    concurrency: Annotated[
        Annotated[int, Meta(ge=1, le=100000)] | None,
        Meta(description="max concurrency; default the baseline's knee (or its highest concurrency)"),
    ] = None
    baseline_path: Annotated[Path | None, Meta(description="default <state_dir>/bench-baseline.json")] = None
    serving_python: Annotated[
        str | None, Meta(description="Python with vLLM; default: that of the running vLLM process")
    ] = None
    command_prefix: Annotated[
        list[str],
        Meta(
            description="argv put before the benchmark client, e.g. to run it outside the daemon's own memory and CPU "
            'limits: ["systemd-run", "--scope", "--quiet", "--"]'
        ),
    ] = field(default_factory=list)
    throughput_tolerance: Annotated[float, Meta(gt=0, lt=1, description="a drop beyond this fraction warns")] = 0.10
    tpot_tolerance: Annotated[float, Meta(gt=0, le=100, description="a P99 TPOT rise beyond this fraction warns")] = (
        0.20
    )
    ttft_tolerance: Annotated[float, Meta(gt=0, le=100, description="a P99 TTFT rise beyond this fraction warns")] = (
        0.50
    )

    def __post_init__(self) -> None:
        for window in self.maintenance_windows:
            try:
                parse_window(window)  # the NCCL probe's window syntax: one rule for both
            except ValueError as exc:
                raise ValueError(f"maintenance_windows: {exc}") from None


def vllm_launcher(python: str) -> list[str]:
    """vLLM's command line as run by ``python`` (the serving environment's): ``probes/vllm_cli.py``."""
    from dgxdoctor.probes import vllm_cli  # its path only; the module runs in the serving Python

    return [python, str(Path(vllm_cli.__file__))]


def baseline_path(settings: BenchCheckSettings, env: Environment) -> Path:
    return settings.baseline_path or env.state_dir / "bench-baseline.json"


class BenchCheck(Check[BenchCheckSettings]):
    name: ClassVar[str] = "bench"

    def _reference(self) -> tuple[Baseline, BenchPoint, int] | CheckResult:
        """The baseline, its result at the concurrency to run, and that concurrency; or why there is none."""
        path = baseline_path(self.settings, self.env)
        try:
            baseline = load_baseline(path)
        except BaselineError as exc:
            return CheckResult.unknown(self.name, str(exc))
        if baseline is None:
            return CheckResult.skipped(self.name, f"no baseline at {path}: run `dgxdoctor bench --save-baseline`")
        concurrency = self.settings.concurrency or baseline.knee or max(p.concurrency for p in baseline.points)
        reference = baseline.point_at(concurrency)
        if reference is None:
            return CheckResult.unknown(self.name, f"the baseline has no result at concurrency {concurrency}")
        return baseline, reference, concurrency

    def run(self) -> CheckResult:
        found = self._reference()
        if isinstance(found, CheckResult):
            return found
        last = self._last_run()
        waiting = self._why_not_now(last)
        if waiting is None:
            return self._run_now(*found)
        if last is not None:
            return self._judge(last[1], found[1], last[0], waiting)
        return CheckResult.skipped(self.name, waiting)

    def run_now(self) -> CheckResult:
        """The comparison at once, window or not (``dgxdoctor bench compare``)."""
        found = self._reference()
        return found if isinstance(found, CheckResult) else self._run_now(*found)

    def _why_not_now(self, last: tuple[float, BenchPoint] | None) -> str | None:
        now = self.env.clock()
        if last is not None and now - last[0] < self.settings.period_s:
            return f"next run due {self.settings.period_s - (now - last[0]):.0f} s after the last"
        if not self.settings.maintenance_windows:
            return "runs only in a maintenance window: set checks.bench.maintenance_windows"
        if not in_window(self.settings.maintenance_windows, now):
            return f"outside the maintenance windows ({', '.join(self.settings.maintenance_windows)} UTC)"
        return None

    def _run_now(self, baseline: Baseline, reference: BenchPoint, concurrency: int) -> CheckResult:
        python = self.settings.serving_python
        if python is None:
            found = find_serving_python(self.env.proc_root)
            python = found.exe if found else None
        if python is None:
            return CheckResult.skipped(self.name, "no vLLM process found: set checks.bench.serving_python")
        settings = _with_prompts(baseline, self.settings.num_prompts)
        timeout = max(1.0, self.settings.timeout_s - 5)
        try:
            with tempfile.TemporaryDirectory(prefix="dgxdoctor-bench-") as tmp:
                point = run_step(
                    self.env.run_command,
                    vllm_launcher(python),
                    settings,
                    concurrency,
                    Path(tmp),
                    timeout,
                    self.settings.command_prefix,
                )
        except (BenchRunError, BenchResultError, CommandTimeout, CommandNotFound) as exc:
            return CheckResult.unknown(self.name, str(exc))
        finished = self.env.clock()
        self._save_last(finished, point)
        return self._judge(point, reference, finished, None)

    def _judge(self, point: BenchPoint, reference: BenchPoint, finished: float, note: str | None) -> CheckResult:
        b = ResultBuilder(self.name)
        tol = Tolerances(self.settings.throughput_tolerance, self.settings.tpot_tolerance, self.settings.ttft_tolerance)
        b.add(*compare_to_baseline(point, reference, tol))
        b.sample(OUTPUT_THROUGHPUT, point.output_throughput)
        b.sample(REQUEST_THROUGHPUT, point.request_throughput)
        b.sample(TTFT_P99, None if point.p99_ttft_ms is None else point.p99_ttft_ms / 1000)
        b.sample(TPOT_P99, None if point.p99_tpot_ms is None else point.p99_tpot_ms / 1000)
        b.sample(BASELINE_THROUGHPUT, reference.output_throughput)
        if reference.output_throughput > 0:
            b.sample(THROUGHPUT_RATIO, point.output_throughput / reference.output_throughput)
        b.sample(LAST_RUN, finished)
        ratio = point.output_throughput / reference.output_throughput if reference.output_throughput else 0.0
        summary = (
            f"{point.output_throughput:.1f} tok/s at concurrency {point.concurrency} ({ratio:.0%} of the baseline's "
            f"{reference.output_throughput:.1f}), TPOT P99 {_ms(point.p99_tpot_ms)}"
        )
        if note:
            summary += f"; last run {time.strftime('%Y-%m-%d %H:%M', time.gmtime(finished))} UTC, {note}"
        return b.build(summary)

    def _state_file(self) -> StateFile:
        return StateFile(self.env.state_dir / STATE_FILE, mode=0o640, version=STATE_VERSION)

    def _last_run(self) -> tuple[float, BenchPoint] | None:
        data: Any = self._state_file().load()  # an unreadable or corrupt file is logged and read as none
        try:
            return float(data["finished"]), parse_bench_result(data["result"])
        except (ValueError, KeyError, TypeError):
            return None  # no run yet, or a state file from elsewhere: run again when due

    def _save_last(self, finished: float, point: BenchPoint) -> None:
        # A failure is logged and counted (dgxdoctor_write_errors_total); the verdict stands, and without the file
        # the next look runs the benchmark again when in a window.
        self._state_file().save({"finished": finished, "result": raw_point(point)})


def _with_prompts(baseline: Baseline, num_prompts: int) -> BenchSettings:
    return replace(baseline.settings, num_prompts=num_prompts)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"

"""`nccl`: an all-reduce bandwidth probe, the tutorial's step 4 ("verify cross-node communication with nccl-tests
before starting the model"), judged against the bandwidth this fabric should give.

By hand: ``./all_reduce_perf -b 8 -e 8G -f 2 -g 8`` (both nodes at once, under mpirun for the cross-node figure);
success is an "Avg bus bandwidth" line, large-message busbw at 70 % or more of the NICs' nominal rate, and no
NCCL WARN. Tens of MB/s means NCCL fell back to TCP.

The probe takes GPUs and fabric bandwidth, so the check is off by default: run it with ``dgxdoctor check
--only nccl`` before and after a change, or enable it with a long interval. It runs ``command`` when set (an
nccl-tests binary, or an mpirun line around it); otherwise the bundled torch.distributed probe
(``dgxdoctor/probes/allreduce.py``) with the serving environment's Python, which prints the same table. Either
way one parser reads the output, and NCCL's own error lines are matched against the failure catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.nccl import bandwidth_finding, nccl_tests_findings
from dgxdoctor.judge.signatures import load_catalog
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.nccl_tests import NcclTestsReport, parse_nccl_tests
from dgxdoctor.sources.serving_env import find_serving_python

# The probe's exit status for "cannot run here" (no torch, no GPU): ``dgxdoctor.probes.allreduce.EX_NOT_RUNNABLE``,
# repeated so the daemon does not import the probe (argparse and all) to compare one number; a test holds them equal.
EX_NOT_RUNNABLE = 3

BUSBW = MetricSpec(
    "dgxdoctor_nccl_busbw_bytes_per_second",
    "All-reduce bus bandwidth at the largest message size of the last probe (nccl-tests' busbw).",
)
AVG_BUSBW = MetricSpec(
    "dgxdoctor_nccl_avg_busbw_bytes_per_second",
    "All-reduce bus bandwidth averaged over the probe's message sizes (nccl-tests' 'Avg bus bandwidth').",
)
PROBE_OK = MetricSpec("dgxdoctor_nccl_probe_success", "1 when the last bandwidth probe ran and printed its table.")
EXPECTED_BUSBW = MetricSpec(
    "dgxdoctor_nccl_expected_busbw_bytes_per_second",
    "The bus bandwidth this fabric should give at the largest message ([checks.nccl] expected_busbw_gbps); "
    "absent when not configured.",
)

GB = 1e9


class NcclSettings(CheckSettings):
    """The NCCL all-reduce bandwidth probe (off by default: it uses the GPUs and the fabric)."""

    enabled: bool = Field(False, description="run this check (it occupies the GPUs while it runs)")
    interval_s: float = Field(3600.0, gt=0, description="daemon: seconds between probes")
    timeout_s: float = Field(600.0, gt=0, description="a probe that takes longer is UNKNOWN")
    command: list[str] = Field(
        default_factory=list,
        description='argv of the probe, e.g. ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8M", "-e", '
        '"8G", "-f", "2", "-g", "8"]; empty: the bundled torch.distributed probe',
    )
    serving_python: str | None = Field(
        None,
        description="Python with torch for the bundled probe; default: that of a running vLLM or Ray process",
    )
    gpus: int = Field(0, ge=0, description="bundled probe: GPUs to use (0 = all visible)")
    min_bytes: str = Field("8M", description="bundled probe: smallest message")
    max_bytes: str = Field("1G", description="bundled probe: largest message")
    expected_busbw_gbps: float | None = Field(
        None,
        gt=0,
        description="bus bandwidth this fabric should give at the largest message, GB/s (e.g. 8 x 400 Gb/s NICs: "
        "400); unset: only the TCP-fallback floor is judged",
    )
    min_fraction: float = Field(
        0.7, gt=0, le=1, description="busbw below this fraction of expected_busbw_gbps is critical (the tutorial)"
    )


class NcclCheck(Check):
    name: ClassVar[str] = "nccl"
    settings_model: ClassVar[type[CheckSettings]] = NcclSettings

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        settings = own_settings(self.name, settings, NcclSettings)
        self.settings: CheckSettings = settings
        self.cfg = settings
        self.env = env

    def argv(self) -> list[str] | None:
        cfg = self.cfg
        if cfg.command:
            return list(cfg.command)
        python = cfg.serving_python
        if python is None:
            found = find_serving_python(self.env.proc_root)
            python = found.exe if found else None
        if python is None:
            return None
        from dgxdoctor.probes import allreduce  # argparse and the probe's code: only once there is a probe to run

        argv = [python, str(Path(allreduce.__file__))]
        argv += ["--min-bytes", cfg.min_bytes, "--max-bytes", cfg.max_bytes]
        if cfg.gpus:
            argv += ["--gpus", str(cfg.gpus)]
        return argv

    def run(self) -> CheckResult:
        argv = self.argv()
        if argv is None:
            return CheckResult.skipped(
                self.name, "no probe: set checks.nccl.command (nccl-tests) or checks.nccl.serving_python (torch)"
            )
        # Leave room for the runner's own timeout to report a hang rather than a half-read table.
        timeout = max(1.0, self.cfg.timeout_s - 5)
        try:
            done = self.env.run_command(argv, timeout_s=timeout)
        except CommandNotFound as exc:
            return CheckResult.skipped(self.name, str(exc))
        except CommandTimeout as exc:
            return CheckResult.unknown(self.name, str(exc))
        if not self.cfg.command and done.returncode == EX_NOT_RUNNABLE:
            return CheckResult.skipped(self.name, done.stderr.strip().lstrip("# ") or "probe cannot run here")
        return judge(done.stdout, done.stderr, done.returncode, self.cfg)


def judge(stdout: str, stderr: str, returncode: int, cfg: NcclSettings) -> CheckResult:
    """Pure: the verdict on one probe's output."""
    b = ResultBuilder(NcclCheck.name)
    catalog = load_catalog()
    for match in catalog.scan(stdout + "\n" + stderr):
        sig = match.signature
        b.finding(sig.code, sig.severity, sig.meaning, evidence=match.line.strip()[:500], remedy=sig.fix)
    try:
        report: NcclTestsReport | None = parse_nccl_tests(stdout)
    except ValueError:
        report = None
    if returncode != 0 or report is None or not report.rows:
        tail = (stderr.strip() or stdout.strip())[-400:]
        b.sample(PROBE_OK, 0)
        b.finding(
            "NCCL_PROBE_FAILED",
            Status.CRITICAL,
            f"the bandwidth probe exited {returncode} without a bandwidth table",
            evidence=tail or None,
            remedy="run the probe by hand with NCCL_DEBUG=INFO and read its first WARN line",
        )
        return b.build(f"probe failed (exit {returncode})")
    b.sample(PROBE_OK, 1)
    b.findings.extend(nccl_tests_findings(report))
    largest = max(report.rows, key=lambda r: r.size_bytes)
    peak_at_largest = largest.busbw_gbps
    b.sample(BUSBW, None if peak_at_largest is None else peak_at_largest * GB)
    b.sample(AVG_BUSBW, None if report.avg_busbw_gbps is None else report.avg_busbw_gbps * GB)
    b.sample(EXPECTED_BUSBW, None if cfg.expected_busbw_gbps is None else cfg.expected_busbw_gbps * GB)
    low = bandwidth_finding(report, cfg.expected_busbw_gbps, cfg.min_fraction)
    if low is not None:
        b.findings.append(low)
    avg = "n/a" if report.avg_busbw_gbps is None else f"{report.avg_busbw_gbps:.1f}"
    peak = "n/a" if peak_at_largest is None else f"{peak_at_largest:.1f}"
    return b.build(f"busbw {peak} GB/s at {largest.size_bytes} B, average {avg} GB/s over {len(report.rows)} sizes")

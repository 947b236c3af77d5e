"""The `nccl` bandwidth probe check: verdicts over real probe outputs, and a real subprocess run."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from dgxdoctor.checks.nccl import NcclCheck, NcclSettings, judge
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _sample(result, name: str) -> float:  # type: ignore[no-untyped-def]
    return next(s.value for s in result.samples if s.metric.name == name)


def test_real_h200_probe_output_is_ok_and_exports_busbw() -> None:
    # Captured on the H200 test machine (docs/h200/allreduce.txt): 346.29 GB/s at 8 GiB.
    result = judge((NCCL / "h200_probe_allreduce.txt").read_text(), "", 0, NcclSettings())
    assert result.status is Status.OK, result.findings
    assert _sample(result, "dgxdoctor_nccl_busbw_bytes_per_second") == 346.29e9
    assert "346.3 GB/s" in result.summary


def test_below_seventy_percent_of_expected_is_critical() -> None:
    settings = NcclSettings(expected_busbw_gbps=550.0)
    result = judge((NCCL / "h200_probe_allreduce.txt").read_text(), "", 0, settings)
    assert result.status is Status.CRITICAL
    assert [f.code for f in result.findings] == ["NCCL_BANDWIDTH_LOW"]


def test_tcp_fallback_bandwidth_is_critical() -> None:
    result = judge((NCCL / "v218_socket_low.txt").read_text(), "", 0, NcclSettings())
    assert result.status is Status.CRITICAL
    assert "NCCL_TESTS_LOW_BUSBW" in {f.code for f in result.findings}


def test_failed_probe_names_the_nccl_error() -> None:
    stderr = (LOGS / "nccl_net_failure.log").read_text()
    result = judge("", stderr, 1, NcclSettings())
    codes = {f.code for f in result.findings}
    assert result.status is Status.CRITICAL
    assert {"NCCL_PROBE_FAILED", "NCCL_NET_FAILURE"} <= codes
    assert _sample(result, "dgxdoctor_nccl_probe_success") == 0


def test_runs_the_configured_command_for_real(tmp_path: Path) -> None:
    probe = tmp_path / "all_reduce_perf"
    probe.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(NCCL / 'h200_probe_allreduce.txt')!r}).read())\n"
    )
    probe.chmod(probe.stat().st_mode | stat.S_IXUSR)
    check = NcclCheck(NcclSettings(command=[str(probe), "-b", "8M"]), Environment())
    assert check.run().status is Status.OK


def test_missing_probe_binary_is_skipped(tmp_path: Path) -> None:
    check = NcclCheck(NcclSettings(command=[str(tmp_path / "nope")]), Environment())
    assert check.run().status is Status.SKIPPED


def test_bundled_probe_argv_uses_the_serving_python() -> None:
    check = NcclCheck(NcclSettings(serving_python="/opt/vllm/bin/python", gpus=8), Environment())
    argv = check.argv()
    assert argv is not None
    assert argv[0] == "/opt/vllm/bin/python"
    assert argv[1] == "-I" and argv[2].endswith("probes/allreduce.py")
    assert argv[-2:] == ["--gpus", "8"]


def test_probe_sizes_parse() -> None:
    from dgxdoctor.probes.allreduce import parse_size, sizes

    assert parse_size("8M") == 8 << 20
    assert parse_size("1G") == 1 << 30
    assert sizes(1 << 20, 8 << 20, 2) == [1 << 20, 2 << 20, 4 << 20, 8 << 20]


def test_not_runnable_status_is_the_probes() -> None:
    from dgxdoctor.checks import nccl
    from dgxdoctor.probes import allreduce

    assert nccl.EX_NOT_RUNNABLE == allreduce.EX_NOT_RUNNABLE

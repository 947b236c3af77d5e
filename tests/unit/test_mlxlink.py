"""mlxlink's module temperature and effective BER per port (recorded outputs), SKIPPED with a reason when absent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dgxdoctor.checks.mlxlink import MlxlinkCheck, MlxlinkSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult
from dgxdoctor.sources.mlxlink import parse_mlxlink
from sysfstree import build_sysfs_tree

IB = Path(__file__).resolve().parents[1] / "fixtures" / "ib"


def test_parse_mlxlink() -> None:
    hot = parse_mlxlink((IB / "mlxlink_cx7_ndr_module_hot.txt").read_text())
    assert (hot.module_temperature_c, hot.effective_ber) == (79.0, 2e-11)
    healthy = parse_mlxlink((IB / "mlxlink_cx7_ndr_healthy.txt").read_text())
    assert (healthy.module_temperature_c, healthy.effective_ber) == (46.0, 15e-255)


def test_a_hot_module_and_a_high_ber_are_named_per_port(tmp_path: Path) -> None:
    sysfs = build_sysfs_tree(tmp_path, "dgx_ndr_healthy.txt")
    calls: list[list[str]] = []

    def run(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        calls.append(list(argv))
        name = "mlxlink_cx7_ndr_module_hot.txt" if argv[2] == "mlx5_4" else "mlxlink_cx7_ndr_healthy.txt"
        return CommandResult(tuple(argv), 0, (IB / name).read_text(), "")

    result = MlxlinkCheck(MlxlinkSettings(), Environment(sysfs_root=sysfs, run_command=run)).run()
    assert calls[0] == ["mlxlink", "-d", "mlx5_0", "-p", "1", "-m", "-c"] and len(calls) == 8
    by_code = {(f.code, f.subject): f.status for f in result.findings}
    assert by_code == {
        ("IB_MODULE_TEMPERATURE_HIGH", "mlx5_4/1"): Status.WARNING,
        ("IB_EFFECTIVE_BER_HIGH", "mlx5_4/1"): Status.WARNING,
    }
    temps = {s.labels["device"]: s.value for s in result.samples if s.metric.name.endswith("temperature_celsius")}
    assert temps["mlx5_4"] == 79.0 and temps["mlx5_0"] == 46.0


def test_without_mlxlink_the_check_is_skipped_with_a_reason(tmp_path: Path) -> None:
    sysfs = build_sysfs_tree(tmp_path, "dgx_ndr_healthy.txt")

    def absent(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        raise CommandNotFound("mlxlink not found in PATH")

    result = MlxlinkCheck(MlxlinkSettings(), Environment(sysfs_root=sysfs, run_command=absent)).run()
    assert result.status == Status.SKIPPED and "mlxlink not installed" in result.summary


def test_unreadable_output_is_unknown_not_ok(tmp_path: Path) -> None:
    sysfs = build_sysfs_tree(tmp_path, "dgx_ndr_healthy.txt")

    def broken(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "-E- Failed to open device")

    result = MlxlinkCheck(MlxlinkSettings(), Environment(sysfs_root=sysfs, run_command=broken)).run()
    assert result.status == Status.UNKNOWN

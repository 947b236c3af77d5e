"""The driver stack judged from recorded `systemctl show` outputs and sysfs trees (the DGX H100 PCI tree)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dgxdoctor.checks.driver_stack import DriverStackCheck, DriverStackSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult
from dgxdoctor.sources.systemd import parse_systemctl_show
from dgxdoctor.validation import validate
from pcitree import build_pci_tree

# `systemctl show -p LoadState,ActiveState,SubState,Result UNIT`, as systemd 252 (Debian 12) prints it.
RUNNING = "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\n"
FAILED = "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n"
NOT_FOUND = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\n"
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build  (dvs-builder@U22)\n"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)\n"


def recorded(outputs: dict[str, str]):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        assert list(argv[:4]) == ["systemctl", "show", "-p", "LoadState,ActiveState,SubState,Result"]
        return CommandResult(tuple(argv), 0, outputs[argv[4]], "")

    return run


def run_check(tmp_path: Path, pci: str, units: dict[str, str], peermem: bool = True, version: str | None = PROPRIETARY,
              **settings: object) -> CheckResult:  # fmt: skip
    sysfs = build_pci_tree(tmp_path / "sys", pci)
    if peermem:
        (sysfs / "module" / "nvidia_peermem").mkdir(parents=True)
    proc = tmp_path / "proc"
    if version is not None:
        (proc / "driver" / "nvidia").mkdir(parents=True)
        (proc / "driver" / "nvidia" / "version").write_text(version)
    env = Environment(sysfs_root=sysfs, proc_root=proc, run_command=recorded(units))
    return DriverStackCheck(validate(DriverStackSettings, settings), env).run()  # type: ignore[arg-type]


HEALTHY = {"nvidia-fabricmanager.service": RUNNING, "nvidia-persistenced.service": RUNNING}


def codes(result: CheckResult) -> dict[str, Status]:
    return {f.code: f.status for f in result.findings}


def test_a_complete_stack_is_ok(tmp_path: Path) -> None:
    result = run_check(tmp_path, "dgx_h100.txt", HEALTHY)
    assert result.status == Status.OK
    assert codes(result) == {
        "DRIVER_FABRIC_MANAGER_DOWN_OK": Status.OK,
        "DRIVER_PERSISTENCED_DOWN_OK": Status.OK,
        "DRIVER_GPUDIRECT_RDMA_OK": Status.OK,
    }
    assert "8 GPU(s), 4 NVSwitch(es), 10 RDMA NIC(s)" in result.summary


@pytest.mark.parametrize("fm", [FAILED, NOT_FOUND])
def test_fabric_manager_down_on_an_nvswitch_node_is_critical(tmp_path: Path, fm: str) -> None:
    result = run_check(tmp_path, "dgx_h100.txt", {**HEALTHY, "nvidia-fabricmanager.service": fm})
    assert result.status == Status.CRITICAL
    finding = next(f for f in result.findings if f.code == "DRIVER_FABRIC_MANAGER_DOWN")
    assert "system not yet initialized" in finding.message
    assert ("Result=exit-code" in finding.message) == (fm == FAILED)


def test_no_nvswitch_no_fabric_manager_needed(tmp_path: Path) -> None:
    result = run_check(tmp_path, "h200_vm.txt", {"nvidia-persistenced.service": RUNNING})
    assert result.status == Status.OK and "DRIVER_FABRIC_MANAGER_DOWN" not in codes(result)
    assert "DRIVER_GPUDIRECT_RDMA_OK" not in codes(result)  # no RDMA NIC: GPUDirect is not asked


def test_what_only_costs_speed_is_a_warning(tmp_path: Path) -> None:
    units = {**HEALTHY, "nvidia-persistenced.service": FAILED}
    result = run_check(tmp_path, "dgx_h100.txt", units, peermem=False)
    assert codes(result)["DRIVER_PERSISTENCED_DOWN"] == Status.WARNING
    assert codes(result)["DRIVER_GPUDIRECT_RDMA_OFF"] == Status.WARNING
    assert result.status == Status.WARNING


def test_dma_buf_of_the_open_module_is_gpudirect_and_unreadable_is_unknown(tmp_path: Path) -> None:
    assert (
        codes(run_check(tmp_path / "a", "dgx_h100.txt", HEALTHY, peermem=False, version=OPEN))[
            "DRIVER_GPUDIRECT_RDMA_OK"
        ]
        == Status.OK
    )
    unread = run_check(tmp_path / "b", "dgx_h100.txt", HEALTHY, peermem=False, version=None)
    assert codes(unread)["DRIVER_GPUDIRECT_RDMA_UNKNOWN"] == Status.UNKNOWN


def test_dcgm_when_configured_and_systemctl_missing_is_unknown(tmp_path: Path) -> None:
    units = {**HEALTHY, "nvidia-dcgm.service": NOT_FOUND}
    assert codes(run_check(tmp_path / "a", "dgx_h100.txt", units, dcgm=True))["DRIVER_DCGM_DOWN"] == Status.WARNING

    def no_systemctl(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        raise CommandNotFound("systemctl not found in PATH")

    sysfs = build_pci_tree(tmp_path / "b" / "sys", "dgx_h100.txt")
    env = Environment(sysfs_root=sysfs, proc_root=tmp_path / "none", run_command=no_systemctl)
    result = DriverStackCheck(DriverStackSettings(), env).run()
    assert codes(result)["DRIVER_UNIT_UNKNOWN"] == Status.UNKNOWN
    assert result.status == Status.UNKNOWN  # never OK when the state could not be read


def test_no_gpu_on_the_bus_is_skipped(tmp_path: Path) -> None:
    env = Environment(sysfs_root=tmp_path, run_command=recorded({}))
    assert DriverStackCheck(DriverStackSettings(), env).run().status == Status.SKIPPED


def test_bad_unit_names_and_output_are_refused() -> None:
    with pytest.raises(ValueError, match="not a systemd unit name"):
        validate(DriverStackSettings, {"fabric_manager_unit": "fm; rm -rf /"})
    with pytest.raises(ValueError, match="no ActiveState"):
        parse_systemctl_show("System has not been booted with systemd as init system (PID 1).", "x.service")


def test_nvml_fabric_state_where_the_gpu_reports_it(tmp_path: Path) -> None:
    from fake_nvml import FakeNvml, load_capture

    nvml = FakeNvml(load_capture("h100-hgx-8gpu-565.57.01.json"))
    for i in range(8):
        nvml.gpu(i)["fabric_state"] = [3, 0]  # NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS
    nvml.gpu(5)["fabric_state"] = [2, 0]  # IN_PROGRESS: the fabric manager has not finished with GPU 5
    sysfs = build_pci_tree(tmp_path / "sys", "dgx_h100.txt")
    (sysfs / "module" / "nvidia_peermem").mkdir(parents=True)
    env = Environment(sysfs_root=sysfs, proc_root=tmp_path, run_command=recorded(HEALTHY), nvml_factory=lambda: nvml)
    result = DriverStackCheck(DriverStackSettings(), env).run()
    finding = next(f for f in result.findings if f.code == "DRIVER_FABRIC_NOT_READY")
    assert finding.status == Status.CRITICAL and "GPU 5 IN_PROGRESS" in finding.message
    assert nvml.shutdown_calls == 1
    nvml.gpu(5)["fabric_state"] = [3, 0]
    assert codes(DriverStackCheck(DriverStackSettings(), env).run())["DRIVER_FABRIC_NOT_READY_OK"] == Status.OK

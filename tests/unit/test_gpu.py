"""The gpu check on recorded NVML values (tests/fixtures/nvml), one test per decision."""

from __future__ import annotations

import asyncio
import ctypes.util
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli
from dgxdoctor.checks.base import CheckRunner
from dgxdoctor.checks.gpu import GpuCheck, GpuSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.nvml import (
    NvmlError,
    NvmlGpuLost,
    NvmlLibraryNotFound,
    NvmlNotSupported,
    PynvmlClient,
    error_for_code,
    normalize_pci_bus_id,
)
from dgxdoctor.validation import validate
from fake_nvml import NO_LIBRARY, FakeNvml, load_capture, lost, not_supported

H200 = "h200-2gpu-580.159.04.json"
H100 = "h100-hgx-8gpu-565.57.01.json"
H200_LOAD = "h200-1gpu-580.159.04-load.json"
H200_SETTINGS: dict[str, Any] = {"expected_count": 2, "expected_model": "H200", "expected_nvlinks": 18}


def make(fake: FakeNvml, tmp_path: Path, **settings: Any) -> GpuCheck:
    # An empty sysfs: no PCI tree to compare with (tests/unit/test_presence.py lays one out).
    env = Environment(node="test", state_dir=tmp_path, sysfs_root=tmp_path / "sys", nvml_factory=lambda: fake)
    return GpuCheck(validate(GpuSettings, settings), env)


def h200(tmp_path: Path, **settings: Any) -> tuple[FakeNvml, GpuCheck]:
    fake = FakeNvml(load_capture(H200))
    return fake, make(fake, tmp_path, **{**H200_SETTINGS, **settings})


def codes(result: CheckResult) -> dict[str, Status]:
    return {f.code: f.status for f in result.findings}


def sample(result: CheckResult, metric: str, **labels: str) -> float | None:
    for s in result.samples:
        if s.metric.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


# -- healthy real machines


def test_h200_test_machine_capture_is_healthy(tmp_path: Path) -> None:
    _, check = h200(tmp_path)
    result = check.run()
    assert result.status is Status.OK, result.findings
    assert result.summary == "2 GPUs (NVIDIA H200): healthy"
    assert result.facts == {
        "gpu_count": "2",
        "driver_version": "580.159.04",
        "cuda_driver_version": "13.0",
        "gpu_name": "NVIDIA H200",
    }
    labels = {"gpu": "0", "pci_bus_id": "0000:00:06"}
    assert sample(result, "dgxdoctor_gpu_memory_total_bytes", **labels) == 150754820096
    assert sample(result, "dgxdoctor_gpu_memory_used_bytes", **labels) == 0
    assert sample(result, "dgxdoctor_gpu_utilization_ratio", **labels) == 0.0
    assert sample(result, "dgxdoctor_gpu_temperature_celsius", **labels) == 32
    assert sample(result, "dgxdoctor_gpu_power_watts", **labels) == pytest.approx(77.744)
    assert sample(result, "dgxdoctor_gpu_power_limit_watts", **labels) == 700
    assert sample(result, "dgxdoctor_gpu_nvlink_links_up", **labels) == 18
    assert sample(result, "dgxdoctor_gpu_pcie_link_width_lanes", **labels) == 16
    assert sample(result, "dgxdoctor_gpu_recovery_action", **labels) == 0
    assert sample(result, "dgxdoctor_gpu_clock_event_active", **labels, reason="gpu_idle") == 1
    assert sample(result, "dgxdoctor_gpu_clock_event_active", **labels, reason="hw_slowdown") == 0
    # A lifetime (aggregate) uncorrected error with nothing since the driver loaded is recorded, not alarmed.
    assert sample(result, "dgxdoctor_gpu_ecc_errors_total", **labels, error="uncorrected", scope="aggregate") == 1
    # Hopper does not support page retirement: absent, never exported as 0.
    assert sample(result, "dgxdoctor_gpu_retired_pages_pending", **labels) is None


def test_h100_hgx_node_is_healthy_with_default_settings(tmp_path: Path) -> None:
    result = make(FakeNvml(load_capture(H100)), tmp_path).run()
    assert result.status is Status.OK, result.findings
    assert result.facts["gpu_count"] == "8"
    assert result.facts["cuda_driver_version"] == "12.7"
    assert sample(result, "dgxdoctor_gpus") == 8


# -- count and model


def test_count_mismatch_is_critical(tmp_path: Path) -> None:
    _, check = h200(tmp_path, expected_count=8)
    result = check.run()
    assert codes(result) == {"GPU_COUNT_MISMATCH": Status.CRITICAL}
    assert result.status is Status.CRITICAL
    assert "NVML sees 2 GPUs, expected 8" in result.findings[0].message


def test_count_check_can_be_disabled(tmp_path: Path) -> None:
    _, check = h200(tmp_path, expected_count=0)
    assert check.run().status is Status.OK


def test_mixed_models_are_critical(tmp_path: Path) -> None:
    fake = FakeNvml(load_capture(H100))
    fake.gpu(3)["name"] = "NVIDIA H100 PCIe"
    result = make(fake, tmp_path).run()
    assert codes(result) == {"GPU_MODEL_MIXED": Status.CRITICAL}
    assert result.facts["gpu_name"] == "NVIDIA H100 80GB HBM3,NVIDIA H100 PCIe"


def test_unexpected_model_is_critical(tmp_path: Path) -> None:
    result = make(FakeNvml(load_capture(H100)), tmp_path, expected_model="H200").run()
    assert set(codes(result)) == {"GPU_MODEL_UNEXPECTED"}
    assert len(result.findings) == 8


# -- temperature


def test_at_maximum_operating_temperature_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(1).update(temperature_c=87, temperature_margin_c=0)
    result = check.run()
    assert codes(result) == {"GPU_TEMPERATURE_CRITICAL": Status.CRITICAL}
    assert result.findings[0].subject == "GPU-b90d2063-f0d3-3b7a-88c3-f745e5d78049"


def test_near_maximum_operating_temperature_warns(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0).update(temperature_c=83, temperature_margin_c=4)
    assert codes(check.run()) == {"GPU_TEMPERATURE_HIGH": Status.WARNING}


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [(89, {"GPU_TEMPERATURE_CRITICAL": Status.CRITICAL}), (85, {"GPU_TEMPERATURE_HIGH": Status.WARNING}), (80, {})],
)
def test_absolute_slowdown_threshold_without_margin(
    tmp_path: Path, temperature: int, expected: dict[str, Status]
) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0).update(temperature_c=temperature, temperature_margin_c=not_supported())
    assert codes(check.run()) == expected


# -- clock events


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        (0x004 | 0x010, {}),  # SW power cap + sync boost: normal at full load
        (0x008 | 0x040, {"GPU_HW_THERMAL_SLOWDOWN": Status.CRITICAL}),
        (0x008 | 0x080, {"GPU_HW_POWER_BRAKE": Status.CRITICAL}),
        (0x008, {"GPU_HW_SLOWDOWN": Status.WARNING}),
        (0x020, {"GPU_SW_THERMAL_SLOWDOWN": Status.WARNING}),
    ],
)
def test_clock_event_reasons(tmp_path: Path, reasons: int, expected: dict[str, Status]) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["clock_event_reasons"] = reasons
    result = check.run()
    assert codes(result) == expected
    labels = {"gpu": "0", "pci_bus_id": "0000:00:06"}
    assert sample(result, "dgxdoctor_gpu_clock_event_active", **labels, reason="sw_power_cap") == (
        1 if reasons & 0x004 else 0
    )


# -- memory errors


def test_volatile_uncorrected_ecc_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(1)["ecc_volatile_uncorrected"] = 2
    result = check.run()
    assert codes(result) == {"GPU_ECC_UNCORRECTED": Status.CRITICAL}
    assert result.action is not None and "reset" in result.action.remedy


def test_row_remap_pending_warns_reset_to_apply(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["remapped_rows"] = {"corrected": 0, "uncorrected": 1, "pending": True, "failure": False}
    result = check.run()
    assert codes(result) == {"GPU_ROW_REMAP_PENDING": Status.WARNING}
    assert "reset GPU to apply" in result.findings[0].message
    assert sample(result, "dgxdoctor_gpu_remapped_rows_total", gpu="0", error="uncorrected") == 1


def test_row_remap_failure_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["remapped_rows"] = {"corrected": 0, "uncorrected": 8, "pending": False, "failure": True}
    assert codes(check.run()) == {"GPU_ROW_REMAP_FAILED": Status.CRITICAL}


def test_retired_pages_pending_warns(tmp_path: Path) -> None:
    fake = FakeNvml(load_capture(H100))
    fake.gpu(2)["retired_pages_pending"] = True
    result = make(fake, tmp_path).run()
    assert codes(result) == {"GPU_RETIRED_PAGES_PENDING": Status.WARNING}
    assert sample(result, "dgxdoctor_gpu_retired_pages_pending", gpu="2") == 1


# -- NVLink


def test_nvlink_down_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(1)["nvlink_active"][5] = False
    result = check.run()
    assert codes(result) == {"NVLINK_DOWN": Status.CRITICAL}
    assert "link(s) 5 down (17/18 up)" in result.findings[0].message
    assert sample(result, "dgxdoctor_gpu_nvlink_up", gpu="1", link="5") == 0
    assert sample(result, "dgxdoctor_gpu_nvlink_links_up", gpu="1") == 17


def test_fewer_nvlinks_than_expected_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["nvlink_active"][17] = not_supported()
    assert codes(check.run()) == {"NVLINK_DOWN": Status.CRITICAL}


def test_no_nvlink_on_a_pcie_card_is_not_a_fault(tmp_path: Path) -> None:
    fake, check = h200(tmp_path, expected_nvlinks=0)
    for index in (0, 1):
        fake.gpu(index)["nvlink_active"] = [not_supported() for _ in range(18)]
    result = check.run()
    assert result.status is Status.OK
    assert sample(result, "dgxdoctor_gpu_nvlink_links_up", gpu="0") is None


# -- PCIe


def test_pcie_width_degraded_warns(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["pcie_width_current"] = 8
    result = check.run()
    assert codes(result) == {"GPU_PCIE_WIDTH_DEGRADED": Status.WARNING}
    assert "x8, capable of x16" in result.findings[0].message


def test_low_pcie_generation_at_idle_is_power_saving(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0).update(pcie_generation_current=1, utilization_gpu_percent=0)
    assert check.run().status is Status.OK


def test_low_pcie_generation_under_load_warns(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0).update(pcie_generation_current=3, utilization_gpu_percent=97)
    assert codes(check.run()) == {"GPU_PCIE_GEN_DEGRADED": Status.WARNING}


# -- power


def test_reduced_power_limit_warns(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["power_limit_mw"] = 400000
    assert codes(check.run()) == {"GPU_POWER_LIMIT_REDUCED": Status.WARNING}


def test_power_at_cap_alarms_only_when_configured(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["power_usage_mw"] = 690000
    assert check.run().status is Status.OK
    fake2, check2 = h200(tmp_path, power_warn_fraction=0.95)
    fake2.gpu(0)["power_usage_mw"] = 690000
    assert codes(check2.run()) == {"GPU_POWER_HIGH": Status.WARNING}


# -- recovery action


@pytest.mark.parametrize(
    ("action", "kind", "words"),
    [(1, "reset_gpu", "gpu reset"), (2, "reboot_node", "node reboot"), (4, "reset_gpu", "drain and reset")],
)
def test_driver_recovery_action_is_critical(tmp_path: Path, action: int, kind: str, words: str) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(1)["recovery_action"] = action
    result = check.run()
    assert codes(result) == {"GPU_RECOVERY_ACTION": Status.CRITICAL}
    assert words in result.findings[0].message
    assert result.action is not None and result.action.kind == kind


# -- absent values, lost GPUs, read errors


def test_not_supported_fields_are_absent_not_zero(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    gpu = fake.gpu(0)
    for key in (
        "temperature_c",
        "temperature_margin_c",
        "power_usage_mw",
        "memory_info",
        "clock_event_reasons",
        "ecc_volatile_uncorrected",
        "remapped_rows",
        "pcie_width_current",
        "recovery_action",
    ):
        gpu[key] = not_supported(f"{key}: Not Supported")
    result = check.run()
    assert result.status is Status.OK, result.findings
    labels = {"gpu": "0", "pci_bus_id": "0000:00:06"}
    for metric in (
        "dgxdoctor_gpu_temperature_celsius",
        "dgxdoctor_gpu_power_watts",
        "dgxdoctor_gpu_memory_used_bytes",
        "dgxdoctor_gpu_clock_event_active",
        "dgxdoctor_gpu_row_remap_pending",
        "dgxdoctor_gpu_pcie_link_width_lanes",
        "dgxdoctor_gpu_recovery_action",
    ):
        assert sample(result, metric, **labels) is None, metric
    assert sample(result, "dgxdoctor_gpu_temperature_celsius", gpu="1") == 35


def test_gpu_whose_handle_is_lost_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(1).clear()
    fake.gpu(1)["device"] = lost("nvmlDeviceGetHandleByIndex: GPU is lost")
    result = check.run()
    assert codes(result) == {"GPU_LOST": Status.CRITICAL}
    assert result.findings[0].subject == "gpu1"
    assert result.facts["gpu_count"] == "2"
    assert sample(result, "dgxdoctor_gpu_temperature_celsius", gpu="0") == 32


def test_gpu_lost_mid_read_is_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["temperature_c"] = lost("nvmlDeviceGetTemperature: GPU is lost")
    assert codes(check.run()) == {"GPU_LOST": Status.CRITICAL}


def test_other_read_errors_are_unknown_not_critical(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    fake.gpu(0)["power_usage_mw"] = {"error": "error", "message": "nvmlDeviceGetPowerUsage: Unknown Error"}
    result = check.run()
    assert codes(result) == {"GPU_READ_ERROR": Status.UNKNOWN}
    assert result.status is Status.UNKNOWN


# -- lifecycle: init once, recover after failure, skip when absent


def test_no_nvml_library_is_skipped_and_init_is_retried(tmp_path: Path) -> None:
    fake = FakeNvml(load_capture(H200), init_error=NO_LIBRARY)
    check = make(fake, tmp_path, **H200_SETTINGS)
    result = check.run()
    assert result.status is Status.SKIPPED
    assert result.summary == "NVML library not found (libnvidia-ml.so.1 did not load); no NVIDIA GPU on the PCI bus"
    fake.init_error = None
    assert check.run().status is Status.OK
    assert fake.init_calls == 2


def test_nvml_is_initialised_once_per_instance(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    for _ in range(3):
        assert check.run().status is Status.OK
    assert fake.init_calls == 1
    check.stop()
    assert fake.shutdown_calls == 1


def test_zero_gpus_is_skipped(tmp_path: Path) -> None:
    capture = load_capture(H200)
    capture["gpus"] = []
    result = make(FakeNvml(capture), tmp_path).run()
    assert result.status is Status.SKIPPED
    assert result.summary == "NVML reports no GPUs on this node"


async def test_hung_nvml_is_unknown_through_the_runner(tmp_path: Path) -> None:
    release = threading.Event()
    fake = FakeNvml(load_capture(H200), hang=release)
    env = Environment(node="test", state_dir=tmp_path, nvml_factory=lambda: fake)
    check = GpuCheck(validate(GpuSettings, {**H200_SETTINGS, "timeout_s": 0.2}), env)
    runner = CheckRunner(env)
    try:
        result = await runner.run(check)
        assert result.status is Status.UNKNOWN
        assert result.error == "gpu did not answer in 0.2 s (nvml hung)"
        assert result.timeouts == ("nvml",)
        again = await runner.run(check)
        assert again.status is Status.UNKNOWN
        assert "hung" in (again.error or "")
    finally:
        release.set()
        # Let the released thread hand its result to a loop that is still running.
        while any(t.name == "check-gpu" and t.is_alive() for t in threading.enumerate()):
            await asyncio.sleep(0.01)


def test_default_timeout_is_short_of_the_interval() -> None:
    settings = GpuSettings()
    assert settings.timeout_s < settings.interval_s
    assert settings.expected_count == 8


# -- the real client and the CLI on this machine


def _libnvml_present() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None


@pytest.mark.skipif(_libnvml_present(), reason="libnvidia-ml is installed here: the absent-library path cannot run")
def test_pynvml_client_without_the_library_says_so() -> None:
    with pytest.raises(NvmlLibraryNotFound, match="NVML library not found"):
        PynvmlClient().init()


@pytest.mark.skipif(_libnvml_present(), reason="libnvidia-ml is installed here: the gpu check would not skip")
def test_cli_reports_gpu_skipped_without_nvml() -> None:
    run = run_cli("check", "--only", "gpu", "--json")
    assert run.returncode == 0, run.stderr
    (gpu,) = run.json()["checks"]
    assert gpu["name"] == "gpu"
    assert gpu["status"] == "skipped"
    assert "NVML library not found" in gpu["summary"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("00000000:18:00.0", "0000:18:00"), ("00000000:DB:00.0", "0000:db:00"), ("0001:C8:00.0", "0001:c8:00")],
)
def test_pci_bus_id_is_normalised_to_the_kernel_log_form(raw: str, expected: str) -> None:
    assert normalize_pci_bus_id(raw) == expected


def test_nvml_failure_mid_sweep_is_raised_and_nvml_reinitialised_next_run(tmp_path: Path) -> None:
    fake, check = h200(tmp_path)
    gpus = fake.capture["gpus"]
    fake.capture["gpus"] = {"error": "error", "message": "nvmlDeviceGetCount: Unknown Error"}
    with pytest.raises(NvmlError, match="Unknown Error"):
        check.run()
    assert fake.shutdown_calls == 1
    fake.capture["gpus"] = gpus
    assert check.run().status is Status.OK
    assert fake.init_calls == 2


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (3, NvmlNotSupported),  # NOT_SUPPORTED
        (4, NvmlNotSupported),  # NO_PERMISSION
        (13, NvmlNotSupported),  # FUNCTION_NOT_FOUND
        (9, NvmlLibraryNotFound),  # DRIVER_NOT_LOADED
        (12, NvmlLibraryNotFound),  # LIBRARY_NOT_FOUND
        (15, NvmlGpuLost),  # GPU_IS_LOST
        (16, NvmlGpuLost),  # RESET_REQUIRED
        (999, NvmlError),  # UNKNOWN
    ],
)
def test_nvml_return_codes_map_to_typed_errors(code: int, kind: type[NvmlError]) -> None:
    assert type(error_for_code(code, "x")) is kind


def test_full_load_at_the_power_cap_is_healthy(tmp_path: Path) -> None:
    """Real values under a bf16 matmul loop: 100 % busy, 690 of 700 W, SW power cap active, 66 C, Gen5 x16."""
    fake = FakeNvml(load_capture(H200_LOAD))
    result = make(fake, tmp_path, expected_count=1, expected_model="H200").run()
    assert result.status is Status.OK, result.findings
    labels = {"gpu": "0", "pci_bus_id": "0000:00:06"}
    assert sample(result, "dgxdoctor_gpu_utilization_ratio", **labels) == 1.0
    assert sample(result, "dgxdoctor_gpu_clock_event_active", **labels, reason="sw_power_cap") == 1
    assert sample(result, "dgxdoctor_gpu_temperature_margin_celsius", **labels) == 17
    # This one-GPU machine exposes no NVLink (every link Not Supported): no NVLink series at all.
    assert sample(result, "dgxdoctor_gpu_nvlink_links_up", **labels) is None
    # With that load, a Gen3 link would be a real degradation.
    fake.gpu(0)["pcie_generation_current"] = 3
    assert codes(make(fake, tmp_path, expected_count=1).run()) == {"GPU_PCIE_GEN_DEGRADED": Status.WARNING}

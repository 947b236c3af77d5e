"""A fake NVML client for tests: replays a capture document (tests/fixtures/nvml/*.json) through the same
``NvmlClient`` protocol ``PynvmlClient`` implements, so the gpu check runs unchanged on recorded values.

Tests change a copy of the recorded values (``gpu(i)["temperature_c"] = 90``) rather than writing new ones.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

from dgxdoctor.sources.nvml import (
    EccCounter,
    EccError,
    NvmlClient,
    NvmlError,
    NvmlGpuLost,
    NvmlLibraryNotFound,
    NvmlNotSupported,
    PcieWhich,
    RemappedRows,
    TempThreshold,
    raw_error,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvml"


def load_capture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return data


class FakeNvml:
    """``NvmlClient`` over recorded values. ``init_error`` makes ``init`` fail; ``hang`` blocks every read until set."""

    def __init__(
        self,
        capture: dict[str, Any],
        *,
        init_error: NvmlError | None = None,
        hang: threading.Event | None = None,
    ) -> None:
        self.capture = copy.deepcopy(capture)
        self.init_error = init_error
        self.hang = hang
        self.init_calls = 0
        self.shutdown_calls = 0
        self.initialised = False

    # -- editing recorded values

    def gpu(self, index: int) -> dict[str, Any]:
        gpus: list[dict[str, Any]] = self.capture["gpus"]
        return gpus[index]

    # -- plumbing

    def _value(self, value: Any) -> Any:
        if self.hang is not None:
            self.hang.wait()
        if not self.initialised:
            raise NvmlError("NVML is not initialised")
        err = raw_error(value)
        if err is not None:
            raise err
        return value

    def _read(self, index: int, key: str) -> Any:
        gpu = self.gpu(index)
        if "device" in gpu:
            self._value(gpu["device"])
        if key not in gpu:
            raise NvmlError(f"fixture has no {key} for GPU {index}")
        return self._value(gpu[key])

    # -- NvmlClient

    def init(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        self.initialised = False

    def driver_version(self) -> str:
        return str(self._value(self.capture["system"]["driver_version"]))

    def cuda_driver_version(self) -> int:
        return int(self._value(self.capture["system"]["cuda_driver_version"]))

    def device_count(self) -> int:
        return len(self._value(self.capture["gpus"]))

    def open_device(self, index: int) -> None:
        gpu = self.gpu(index)
        if "device" in gpu:
            self._value(gpu["device"])
        self._value(None)

    def name(self, index: int) -> str:
        return str(self._read(index, "name"))

    def uuid(self, index: int) -> str:
        return str(self._read(index, "uuid"))

    def pci_bus_id(self, index: int) -> str:
        return str(self._read(index, "pci_bus_id"))

    def temperature_c(self, index: int) -> int:
        return int(self._read(index, "temperature_c"))

    def temperature_margin_c(self, index: int) -> int:
        return int(self._read(index, "temperature_margin_c"))

    def temperature_threshold_c(self, index: int, threshold: TempThreshold) -> int:
        return int(self._read(index, f"threshold_{threshold}_c"))

    def power_usage_mw(self, index: int) -> int:
        return int(self._read(index, "power_usage_mw"))

    def power_limit_mw(self, index: int) -> int:
        return int(self._read(index, "power_limit_mw"))

    def power_default_limit_mw(self, index: int) -> int:
        return int(self._read(index, "power_default_limit_mw"))

    def memory_info(self, index: int) -> tuple[int, int]:
        used, total = self._read(index, "memory_info")
        return int(used), int(total)

    def utilization_gpu_percent(self, index: int) -> int:
        return int(self._read(index, "utilization_gpu_percent"))

    def utilization_memory_percent(self, index: int) -> int:
        # Captured before dgxdoctor read it: absent from those fixtures, answered as a GPU without it would.
        if "utilization_memory_percent" not in self.gpu(index) and "device" not in self.gpu(index):
            raise NvmlNotSupported("fixture has no utilization_memory_percent")
        return int(self._read(index, "utilization_memory_percent"))

    def clock_event_reasons(self, index: int) -> int:
        return int(self._read(index, "clock_event_reasons"))

    def ecc_errors(self, index: int, error: EccError, counter: EccCounter) -> int:
        return int(self._read(index, f"ecc_{counter}_{error}"))

    def retired_pages_pending(self, index: int) -> bool:
        return bool(self._read(index, "retired_pages_pending"))

    def remapped_rows(self, index: int) -> RemappedRows:
        rows = self._read(index, "remapped_rows")
        return RemappedRows(
            int(rows["corrected"]), int(rows["uncorrected"]), bool(rows["pending"]), bool(rows["failure"])
        )

    def nvlink_active(self, index: int, link: int) -> bool:
        links = self._read(index, "nvlink_active")
        if link >= len(links):
            raise NvmlError(f"fixture has no NVLink {link}")
        return bool(self._value(links[link]))

    def pcie_generation(self, index: int, which: PcieWhich) -> int:
        return int(self._read(index, f"pcie_generation_{which}"))

    def pcie_width(self, index: int, which: PcieWhich) -> int:
        return int(self._read(index, f"pcie_width_{which}"))

    def recovery_action(self, index: int) -> int:
        return int(self._read(index, "recovery_action"))

    def fabric_state(self, index: int) -> tuple[int, int]:
        """``fabric_state: [state, status]`` in the capture; captures without it: not reported (older drivers)."""
        if "fabric_state" not in self.gpu(index):
            raise NvmlNotSupported("fabric state not in the capture")
        state, status = self._read(index, "fabric_state")
        return int(state), int(status)


def lost(message: str = "GPU is lost") -> dict[str, str]:
    """A recorded read that failed with NVML_ERROR_GPU_IS_LOST."""
    return {"error": NvmlGpuLost.kind, "message": message}


def not_supported(message: str = "Not Supported") -> dict[str, str]:
    return {"error": "not_supported", "message": message}


NO_LIBRARY = NvmlLibraryNotFound("NVML library not found (libnvidia-ml.so.1 did not load)")


def _conforms(client: FakeNvml) -> NvmlClient:
    """Type-level proof that the fake implements the same protocol as ``PynvmlClient`` (run mypy on this file)."""
    return client

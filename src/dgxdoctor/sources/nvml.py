"""NVML: the client seam (``NvmlClient``), its implementation over NVIDIA's ``pynvml``, and pure snapshots.

The seam is small and owned here: every per-GPU read takes the GPU index and returns a plain Python
value, or raises one of the typed errors below. ``read_raw()`` calls every read once, each guarded on its
own, and returns a JSON-able dict (the shape ``scripts/gpu-capture.py`` prints and the test fake replays);
``GpuSnapshot.from_raw()`` turns that dict into typed values, pure. The check never touches ``pynvml``.

By hand: ``nvidia-smi -q`` (every field read here appears there), ``nvidia-smi nvlink --status``.
NVML reference: https://docs.nvidia.com/deploy/nvml-api/
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from msgspec import Struct, field

# ---------------------------------------------------------------------------------------------------------
# Errors: what the check must tell apart.


class NvmlError(Exception):
    """An NVML call failed. ``code`` is NVML's ``nvmlReturn_t`` when known."""

    kind = "error"

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlNotSupported(NvmlError):
    """NOT_SUPPORTED, NO_PERMISSION or FUNCTION_NOT_FOUND: the value is absent here, not a fault."""

    kind = "not_supported"


class NvmlLibraryNotFound(NvmlError):
    """No libnvidia-ml.so.1, no driver loaded, or no pynvml module: NVML is not present on this node."""

    kind = "library_not_found"


class NvmlGpuLost(NvmlError):
    """GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND: the GPU cannot be read at all (fell off the bus)."""

    kind = "gpu_lost"


_ERROR_KINDS: dict[str, type[NvmlError]] = {
    cls.kind: cls for cls in (NvmlError, NvmlNotSupported, NvmlLibraryNotFound, NvmlGpuLost)
}

# nvmlReturn_t codes (nvml.h; same values as pynvml.NVML_ERROR_*), so the mapping does not need pynvml.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_GPU_NOT_FOUND = 28

_NOT_SUPPORTED_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, NVML_ERROR_FUNCTION_NOT_FOUND})
_LIBRARY_CODES = frozenset({NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED})
_LOST_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, NVML_ERROR_GPU_NOT_FOUND})


def error_for_code(code: int, message: str) -> NvmlError:
    """The typed error for an ``nvmlReturn_t`` code."""
    if code in _NOT_SUPPORTED_CODES:
        return NvmlNotSupported(message, code)
    if code in _LIBRARY_CODES:
        return NvmlLibraryNotFound(message, code)
    if code in _LOST_CODES:
        return NvmlGpuLost(message, code)
    return NvmlError(message, code)


# ---------------------------------------------------------------------------------------------------------
# Constants the check interprets (nvml.h; pynvml names in comments).

# nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*, same bits).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",  # nvmlClocksEventReasonGpuIdle
    0x002: "applications_clocks_setting",  # nvmlClocksEventReasonApplicationsClocksSetting
    0x004: "sw_power_cap",  # nvmlClocksEventReasonSwPowerCap
    0x008: "hw_slowdown",  # nvmlClocksEventReasonHwSlowdown
    0x010: "sync_boost",  # nvmlClocksEventReasonSyncBoost
    0x020: "sw_thermal_slowdown",  # nvmlClocksEventReasonSwThermalSlowdown
    0x040: "hw_thermal_slowdown",  # nvmlClocksEventReasonHwThermalSlowdown
    0x080: "hw_power_brake_slowdown",  # nvmlClocksEventReasonHwPowerBrakeSlowdown
    0x100: "display_clock_setting",  # nvmlClocksEventReasonDisplayClockSetting
}
CLOCK_EVENT_HW_SLOWDOWN = 0x008
CLOCK_EVENT_SW_THERMAL = 0x020
CLOCK_EVENT_HW_THERMAL = 0x040
CLOCK_EVENT_HW_POWER_BRAKE = 0x080

# nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_*), read through field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

# Hopper exposes 18 NVLinks per GPU (NVML_NVLINK_MAX_LINKS is larger; links past the GPU's own are absent).
NVLINK_LINKS_PROBED = 18

TempThreshold = Literal["shutdown", "slowdown", "max_operating"]
EccError = Literal["corrected", "uncorrected"]
EccCounter = Literal["volatile", "aggregate"]
PcieWhich = Literal["current", "max"]


class RemappedRows(Struct, frozen=True):
    """``nvmlDeviceGetRemappedRows``: rows remapped for corrected / uncorrected errors, pending, failure."""

    corrected: int
    uncorrected: int
    pending: bool
    failure: bool


# ---------------------------------------------------------------------------------------------------------
# The seam.


class NvmlClient(Protocol):
    """What the gpu check needs from NVML. Every read returns a plain value or raises an ``NvmlError``."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> int: ...

    def device_count(self) -> int: ...

    def open_device(self, index: int) -> None:
        """Get the GPU's handle; raises ``NvmlGpuLost`` (or ``NvmlError``) when it cannot be read at all."""
        ...

    def name(self, index: int) -> str: ...

    def uuid(self, index: int) -> str: ...

    def pci_bus_id(self, index: int) -> str: ...

    def temperature_c(self, index: int) -> int: ...

    def temperature_threshold_c(self, index: int, threshold: TempThreshold) -> int: ...

    def temperature_margin_c(self, index: int) -> int:
        """Degrees left before the GPU reaches its maximum operating temperature (nvidia-smi "T.Limit")."""
        ...

    def power_usage_mw(self, index: int) -> int: ...

    def power_limit_mw(self, index: int) -> int:
        """The enforced power limit."""
        ...

    def power_default_limit_mw(self, index: int) -> int: ...

    def memory_info(self, index: int) -> tuple[int, int]:
        """(used, total) bytes."""
        ...

    def utilization_gpu_percent(self, index: int) -> int: ...

    def utilization_memory_percent(self, index: int) -> int:
        """Share of the last sample period during which device memory was read or written, percent."""
        ...

    def clock_event_reasons(self, index: int) -> int: ...

    def ecc_errors(self, index: int, error: EccError, counter: EccCounter) -> int: ...

    def retired_pages_pending(self, index: int) -> bool: ...

    def remapped_rows(self, index: int) -> RemappedRows: ...

    def nvlink_active(self, index: int, link: int) -> bool: ...

    def pcie_generation(self, index: int, which: PcieWhich) -> int: ...

    def pcie_width(self, index: int, which: PcieWhich) -> int: ...

    def recovery_action(self, index: int) -> int: ...

    def fabric_state(self, index: int) -> tuple[int, int]:
        """(NVML_GPU_FABRIC_STATE_*, the registration's nvmlReturn) of ``nvmlDeviceGetGpuFabricInfo``: 3 COMPLETED
        once the fabric manager has put the GPU on the NVSwitch fabric; NvmlNotSupported where not reported."""
        ...


# ---------------------------------------------------------------------------------------------------------
# The implementation over pynvml (package nvidia-ml-py). Imported lazily: the agent starts fast and a node
# without the driver gets a clean "NVML library not found".


# What pynvml dlopens on Linux (nvidia-ml-py's _LoadNvmlLibrary).
NVML_LIBRARY = "libnvidia-ml.so.1"


def nvml_library_loads() -> bool:
    """Whether the dynamic loader finds NVML's library, tried before importing pynvml.

    pynvml is 2 MiB of module the daemon would keep for good on a node without the driver only to learn what this
    one dlopen says (the library stays loaded for pynvml when present).
    """
    import ctypes

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True


class PynvmlClient:
    """``NvmlClient`` over NVIDIA's ``pynvml`` module."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- plumbing

    def _call(self, fn_name: str, *args: Any, fallback: str | None = None) -> Any:
        nvml = self._nvml
        if nvml is None:
            raise NvmlError("NVML is not initialised")
        fn = getattr(nvml, fn_name, None)
        if fn is None and fallback is not None:
            fn = getattr(nvml, fallback, None)
        if fn is None:
            raise NvmlNotSupported(f"{fn_name} is not in this pynvml", NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            raise error_for_code(int(exc.value), f"{fn_name}: {exc}") from None

    def _h(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            self.open_device(index)
            handle = self._handles[index]
        return handle

    # -- lifecycle

    def init(self) -> None:
        with self._lock:
            if self._nvml is not None:
                return
            if not nvml_library_loads():
                raise NvmlLibraryNotFound(
                    f"NVML library not found ({NVML_LIBRARY} did not load)", NVML_ERROR_LIBRARY_NOT_FOUND
                )
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlLibraryNotFound(f"NVML library not found: python module pynvml is missing ({exc})") from None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                err = error_for_code(int(exc.value), f"nvmlInit: {exc}")
                if err.code == NVML_ERROR_LIBRARY_NOT_FOUND:
                    raise NvmlLibraryNotFound(
                        "NVML library not found (libnvidia-ml.so.1 did not load)", err.code
                    ) from None
                if err.code == NVML_ERROR_DRIVER_NOT_LOADED:
                    raise NvmlLibraryNotFound(
                        "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded)", err.code
                    ) from None
                raise err from None
            self._nvml = pynvml
            self._handles = {}

    def shutdown(self) -> None:
        with self._lock:
            nvml, self._nvml = self._nvml, None
            self._handles = {}
            if nvml is not None:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlShutdown()

    # -- system

    def driver_version(self) -> str:
        return str(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion_v2", fallback="nvmlSystemGetCudaDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def open_device(self, index: int) -> None:
        self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)

    # -- per GPU

    def name(self, index: int) -> str:
        return str(self._call("nvmlDeviceGetName", self._h(index)))

    def uuid(self, index: int) -> str:
        return str(self._call("nvmlDeviceGetUUID", self._h(index)))

    def pci_bus_id(self, index: int) -> str:
        info = self._call("nvmlDeviceGetPciInfo", self._h(index))
        bus_id = info.busId
        return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)

    def temperature_c(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetTemperature", self._h(index), 0))  # NVML_TEMPERATURE_GPU

    def temperature_threshold_c(self, index: int, threshold: TempThreshold) -> int:
        # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0, _SLOWDOWN = 1, _GPU_MAX = 3
        code = {"shutdown": 0, "slowdown": 1, "max_operating": 3}[threshold]
        return int(self._call("nvmlDeviceGetTemperatureThreshold", self._h(index), code))

    def temperature_margin_c(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetMarginTemperature", self._h(index)))

    def power_usage_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", self._h(index)))

    def power_limit_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetEnforcedPowerLimit", self._h(index)))

    def power_default_limit_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPowerManagementDefaultLimit", self._h(index)))

    def memory_info(self, index: int) -> tuple[int, int]:
        # v2 counts the driver's reservation apart (nvidia-smi "Reserved"), so "used" matches nvidia-smi's
        # Used (0 MiB on an idle H200, against 616 MiB from v1); v1 where the driver or binding lacks v2.
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                mem = self._call("nvmlDeviceGetMemoryInfo", self._h(index), version)
                return int(mem.used), int(mem.total)
            except NvmlNotSupported:
                pass
        mem = self._call("nvmlDeviceGetMemoryInfo", self._h(index))
        return int(mem.used), int(mem.total)

    def utilization_gpu_percent(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", self._h(index)).gpu)

    def utilization_memory_percent(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", self._h(index)).memory)

    def clock_event_reasons(self, index: int) -> int:
        return int(
            self._call(
                "nvmlDeviceGetCurrentClocksEventReasons",
                self._h(index),
                fallback="nvmlDeviceGetCurrentClocksThrottleReasons",
            )
        )

    def ecc_errors(self, index: int, error: EccError, counter: EccCounter) -> int:
        # NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, _UNCORRECTED = 1; NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1
        err = 0 if error == "corrected" else 1
        cnt = 0 if counter == "volatile" else 1
        return int(self._call("nvmlDeviceGetTotalEccErrors", self._h(index), err, cnt))

    def retired_pages_pending(self, index: int) -> bool:
        return bool(self._call("nvmlDeviceGetRetiredPagesPendingStatus", self._h(index)))

    def remapped_rows(self, index: int) -> RemappedRows:
        corr, unc, pending, failure = self._call("nvmlDeviceGetRemappedRows", self._h(index))
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def nvlink_active(self, index: int, link: int) -> bool:
        try:
            return bool(self._call("nvmlDeviceGetNvLinkState", self._h(index), link))
        except NvmlError as exc:
            # A link number past the GPU's own links (an H800 has 8, an H200 18) is INVALID_ARGUMENT.
            if exc.code == NVML_ERROR_INVALID_ARGUMENT:
                raise NvmlNotSupported(str(exc), exc.code) from None
            raise

    def pcie_generation(self, index: int, which: PcieWhich) -> int:
        fn = "nvmlDeviceGetCurrPcieLinkGeneration" if which == "current" else "nvmlDeviceGetMaxPcieLinkGeneration"
        return int(self._call(fn, self._h(index)))

    def pcie_width(self, index: int, which: PcieWhich) -> int:
        fn = "nvmlDeviceGetCurrPcieLinkWidth" if which == "current" else "nvmlDeviceGetMaxPcieLinkWidth"
        return int(self._call(fn, self._h(index)))

    def recovery_action(self, index: int) -> int:
        nvml = self._nvml
        field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            raise NvmlNotSupported("this pynvml has no NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
        values = self._call("nvmlDeviceGetFieldValues", self._h(index), [field_id])
        value = values[0]
        if int(value.nvmlReturn) != 0:
            raise error_for_code(int(value.nvmlReturn), f"field {field_id}: nvmlReturn {int(value.nvmlReturn)}")
        return int(_field_value(value))

    def fabric_state(self, index: int) -> tuple[int, int]:
        import ctypes

        struct = getattr(self._nvml, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            raise NvmlNotSupported("this pynvml has no c_nvmlGpuFabricInfo_t", NVML_ERROR_FUNCTION_NOT_FOUND)
        info = struct()
        self._call("nvmlDeviceGetGpuFabricInfo", self._h(index), ctypes.byref(info))
        return int(info.state), int(info.status)


def _field_value(value: Any) -> float | int:
    """The number in an ``nvmlFieldValue_t``, by its ``valueType`` (NVML_VALUE_TYPE_*)."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        int(value.valueType), "uiVal"
    )
    result: float | int = getattr(value.value, member)
    return result


# ---------------------------------------------------------------------------------------------------------
# Reading: every call guarded on its own, into a JSON-able dict.

RawValue = Any  # a JSON value, or {"error": kind, "message": str}


def _guard(fn: Callable[[], Any]) -> RawValue:
    try:
        value = fn()
    except NvmlError as exc:
        return {"error": exc.kind, "message": str(exc)}
    if isinstance(value, RemappedRows):
        return {
            "corrected": value.corrected,
            "uncorrected": value.uncorrected,
            "pending": value.pending,
            "failure": value.failure,
        }
    if isinstance(value, tuple):
        return list(value)
    return value


def read_raw(client: NvmlClient, index: int) -> dict[str, RawValue]:
    """Every value the check uses for GPU ``index``, each read on its own; failures recorded, never raised.

    If the handle itself cannot be had, only ``{"device": {"error": ...}}`` comes back.
    """
    opened = _guard(lambda: client.open_device(index))
    if isinstance(opened, dict) and "error" in opened:
        return {"device": opened}
    c, i = client, index
    raw: dict[str, RawValue] = {
        "name": _guard(lambda: c.name(i)),
        "uuid": _guard(lambda: c.uuid(i)),
        "pci_bus_id": _guard(lambda: c.pci_bus_id(i)),
        "temperature_c": _guard(lambda: c.temperature_c(i)),
        "temperature_margin_c": _guard(lambda: c.temperature_margin_c(i)),
        "threshold_shutdown_c": _guard(lambda: c.temperature_threshold_c(i, "shutdown")),
        "threshold_slowdown_c": _guard(lambda: c.temperature_threshold_c(i, "slowdown")),
        "threshold_max_operating_c": _guard(lambda: c.temperature_threshold_c(i, "max_operating")),
        "power_usage_mw": _guard(lambda: c.power_usage_mw(i)),
        "power_limit_mw": _guard(lambda: c.power_limit_mw(i)),
        "power_default_limit_mw": _guard(lambda: c.power_default_limit_mw(i)),
        "memory_info": _guard(lambda: c.memory_info(i)),
        "utilization_gpu_percent": _guard(lambda: c.utilization_gpu_percent(i)),
        "utilization_memory_percent": _guard(lambda: c.utilization_memory_percent(i)),
        "clock_event_reasons": _guard(lambda: c.clock_event_reasons(i)),
        "ecc_volatile_uncorrected": _guard(lambda: c.ecc_errors(i, "uncorrected", "volatile")),
        "ecc_volatile_corrected": _guard(lambda: c.ecc_errors(i, "corrected", "volatile")),
        "ecc_aggregate_uncorrected": _guard(lambda: c.ecc_errors(i, "uncorrected", "aggregate")),
        "ecc_aggregate_corrected": _guard(lambda: c.ecc_errors(i, "corrected", "aggregate")),
        "retired_pages_pending": _guard(lambda: c.retired_pages_pending(i)),
        "remapped_rows": _guard(lambda: c.remapped_rows(i)),
        "nvlink_active": [
            _guard(lambda link=link: c.nvlink_active(i, link))  # type: ignore[misc]
            for link in range(NVLINK_LINKS_PROBED)
        ],
        "pcie_generation_current": _guard(lambda: c.pcie_generation(i, "current")),
        "pcie_generation_max": _guard(lambda: c.pcie_generation(i, "max")),
        "pcie_width_current": _guard(lambda: c.pcie_width(i, "current")),
        "pcie_width_max": _guard(lambda: c.pcie_width(i, "max")),
        "recovery_action": _guard(lambda: c.recovery_action(i)),
    }
    return raw


def read_system_raw(client: NvmlClient) -> dict[str, RawValue]:
    return {
        "driver_version": _guard(client.driver_version),
        "cuda_driver_version": _guard(client.cuda_driver_version),
    }


# ---------------------------------------------------------------------------------------------------------
# Pure snapshots.


def is_error(value: RawValue) -> bool:
    return isinstance(value, Mapping) and "error" in value


def raw_error(value: RawValue) -> NvmlError | None:
    """The typed error a raw value records, or None when it holds a value."""
    if not is_error(value):
        return None
    cls = _ERROR_KINDS.get(str(value["error"]), NvmlError)
    return cls(str(value.get("message", value["error"])))


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` -> ``0000:3b:00``: the form the kernel log prints (``NVRM: Xid (PCI:0000:3b:00)``),
    so the gpu and xid metrics share one ``pci_bus_id`` label value. A GPU is always function 0."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) != 3:
        return text
    domain, bus, rest = parts
    device = rest.split(".", 1)[0]
    try:
        return f"{int(domain, 16):04x}:{bus}:{device}"
    except ValueError:
        return text


def _int(value: RawValue) -> int | None:
    if is_error(value) or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _bool(value: RawValue) -> bool | None:
    if is_error(value) or value is None:
        return None
    return bool(value)


def _str(value: RawValue) -> str | None:
    if is_error(value) or value is None:
        return None
    return str(value)


class GpuSnapshot(Struct, frozen=True):
    """One GPU as NVML reported it in one sweep. ``None`` means not available here (absent, not zero)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None  # normalised as the kernel log prints it, e.g. 0000:18:00
    temperature_c: int | None = None
    temperature_margin_c: int | None = None  # "T.Limit": degrees below the maximum operating temperature
    shutdown_c: int | None = None
    slowdown_c: int | None = None
    max_operating_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    clock_event_reasons: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    nvlink_active: dict[int, bool] = field(default_factory=dict)  # only links NVML reports
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    recovery_action: int | None = None
    # The GPU could not be read at all (handle failed); the other fields are then empty.
    unreadable: str | None = None
    lost: bool = False
    # Reads that failed for a reason other than "not supported": field -> message.
    read_errors: dict[str, str] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.uuid or self.pci_bus_id or f"gpu{self.index}"

    @property
    def label(self) -> str:
        where = f" ({self.pci_bus_id})" if self.pci_bus_id else ""
        return f"GPU {self.index}{where}"

    @classmethod
    def from_raw(cls, index: int, raw: Mapping[str, RawValue]) -> GpuSnapshot:
        device = raw.get("device")
        if device is not None:
            lost_err = raw_error(device) or NvmlError("unreadable")
            return cls(index=index, unreadable=str(lost_err), lost=isinstance(lost_err, NvmlGpuLost))

        read_errors, lost = _read_errors(raw)

        def milliwatts(key: str) -> float | None:
            mw = _int(raw.get(key))
            return None if mw is None else mw / 1000.0

        memory = raw.get("memory_info")
        used = total = None
        if isinstance(memory, list) and len(memory) == 2:
            used, total = _int(memory[0]), _int(memory[1])
        util = _int(raw.get("utilization_gpu_percent"))
        mem_util = _int(raw.get("utilization_memory_percent"))
        bus = _str(raw.get("pci_bus_id"))
        return cls(
            index=index,
            name=_str(raw.get("name")),
            uuid=_str(raw.get("uuid")),
            pci_bus_id=normalize_pci_bus_id(bus) if bus else None,
            temperature_c=_int(raw.get("temperature_c")),
            temperature_margin_c=_int(raw.get("temperature_margin_c")),
            shutdown_c=_int(raw.get("threshold_shutdown_c")),
            slowdown_c=_int(raw.get("threshold_slowdown_c")),
            max_operating_c=_int(raw.get("threshold_max_operating_c")),
            power_w=milliwatts("power_usage_mw"),
            power_limit_w=milliwatts("power_limit_mw"),
            power_default_limit_w=milliwatts("power_default_limit_mw"),
            memory_used_bytes=used,
            memory_total_bytes=total,
            utilization_ratio=None if util is None else util / 100.0,
            memory_utilization_ratio=None if mem_util is None else mem_util / 100.0,
            clock_event_reasons=_int(raw.get("clock_event_reasons")),
            ecc_volatile_uncorrected=_int(raw.get("ecc_volatile_uncorrected")),
            ecc_volatile_corrected=_int(raw.get("ecc_volatile_corrected")),
            ecc_aggregate_uncorrected=_int(raw.get("ecc_aggregate_uncorrected")),
            ecc_aggregate_corrected=_int(raw.get("ecc_aggregate_corrected")),
            retired_pages_pending=_bool(raw.get("retired_pages_pending")),
            remapped_rows=_remapped_rows(raw.get("remapped_rows")),
            nvlink_active=_nvlink_states(raw.get("nvlink_active")),
            pcie_gen_current=_int(raw.get("pcie_generation_current")),
            pcie_gen_max=_int(raw.get("pcie_generation_max")),
            pcie_width_current=_int(raw.get("pcie_width_current")),
            pcie_width_max=_int(raw.get("pcie_width_max")),
            recovery_action=_int(raw.get("recovery_action")),
            lost=lost,
            read_errors=read_errors,
        )


def _read_errors(raw: Mapping[str, RawValue]) -> tuple[dict[str, str], bool]:
    """Fields NVML failed to read (not "not supported"), and whether one failure said the GPU is lost."""
    read_errors: dict[str, str] = {}
    lost = False
    for key, value in raw.items():
        values = value if isinstance(value, list) and key == "nvlink_active" else [value]
        for item in values:
            err = raw_error(item)
            if err is not None and not isinstance(err, NvmlNotSupported):
                read_errors.setdefault(key, str(err))
                lost = lost or isinstance(err, NvmlGpuLost)
    return read_errors, lost


def _remapped_rows(rows: RawValue | None) -> RemappedRows | None:
    if not isinstance(rows, Mapping) or is_error(rows):
        return None
    return RemappedRows(
        int(rows.get("corrected", 0)),
        int(rows.get("uncorrected", 0)),
        bool(rows.get("pending", False)),
        bool(rows.get("failure", False)),
    )


def _nvlink_states(raw_links: RawValue | None) -> dict[int, bool]:
    links: dict[int, bool] = {}
    if isinstance(raw_links, list):
        for link, state in enumerate(raw_links):
            active = _bool(state)
            if active is not None:
                links[link] = active
    return links


class NvmlSweep(Struct, frozen=True):
    """Everything one pass over NVML saw."""

    driver_version: str | None
    cuda_driver_version: int | None
    gpus: tuple[GpuSnapshot, ...]


def format_cuda_version(version: int) -> str:
    """NVML's CUDA driver version integer (e.g. 13000) as ``13.0``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def sweep(client: NvmlClient) -> NvmlSweep:
    """Read the system values and every GPU; ``client`` must be initialised. Raises only if the count fails."""
    system = read_system_raw(client)
    count = client.device_count()
    gpus = tuple(GpuSnapshot.from_raw(i, read_raw(client, i)) for i in range(count))
    return NvmlSweep(
        driver_version=_str(system["driver_version"]),
        cuda_driver_version=_int(system["cuda_driver_version"]),
        gpus=gpus,
    )


def _conforms(client: PynvmlClient) -> NvmlClient:
    """Type-level proof that ``PynvmlClient`` implements ``NvmlClient`` (mypy checks this assignment)."""
    return client

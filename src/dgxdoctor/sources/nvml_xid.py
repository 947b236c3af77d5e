"""NVML's XID event API, a second XID source beside the kernel log (which stays the primary one).

``nvmlDeviceRegisterEvents(handle, nvmlEventTypeXidCriticalError, set)`` then ``nvmlEventSetWait(set,
timeout_ms)``: each event names the device and carries the XID in ``eventData``. It works where the
kernel log is out of reach (a container without /dev/kmsg) but says nothing of the driver's text, NVLink
sub-codes or SXids, and some GPUs or vGPU guests do not support it. A wait with nothing to report raises
NVML_ERROR_TIMEOUT (seen on the H200 test machine with a 1 s timeout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from dgxdoctor import eventlog
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.follower import Follower

log = eventlog.get_logger(__name__)

WAIT_MS = 500  # the follower's wait; also how long stop() may take

# nvmlPciInfo_t.busId: "00000000:3B:00.0" (8-digit domain, upper case) -> the kernel log's "0000:3b:00".
NVML_BUS_ID_RE = lazy_compile(
    r"^(?P<domain>[0-9A-Fa-f]{4,8}):(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})(?:\.\d)?$"
)


class NvmlEventsUnavailable(Exception):
    """No NVML library, no driver, or no GPU that supports XID events."""


def nvml_bus_id(raw: str | bytes) -> str:
    """NVML's PCI bus id in the form the kernel log prints it (lowercase, 4-digit domain, no function)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    match = NVML_BUS_ID_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {text!r}")
    return f"{int(match['domain'], 16):04x}:{match['bus']}:{match['dev']}".lower()


class XidEventSource(Protocol):
    def wait(self, timeout_ms: int) -> list[tuple[str, int]]:
        """(pci_bus_id, xid) pairs that arrived, or [] after ``timeout_ms``."""
        ...

    def close(self) -> None: ...


class PynvmlXidEvents:
    """XID events of every GPU that supports them, through nvidia-ml-py."""

    def __init__(self) -> None:
        from dgxdoctor.sources.nvml import NVML_LIBRARY, nvml_library_loads

        if not nvml_library_loads():
            raise NvmlEventsUnavailable(f"NVML did not initialise: {NVML_LIBRARY} did not load")
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlEventsUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlEventsUnavailable(f"NVML did not initialise: {exc}") from None
        try:
            self._set = pynvml.nvmlEventSetCreate()
            registered = 0
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._set)
                except pynvml.NVMLError as exc:
                    log.info("nvml_xid_events_unsupported", gpu=index, error=str(exc))
                    continue
                registered += 1
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise NvmlEventsUnavailable(f"NVML event set: {exc}") from None
        if registered == 0:
            self.close()
            raise NvmlEventsUnavailable("no GPU supports NVML XID events here")
        self.gpus = registered

    def wait(self, timeout_ms: int) -> list[tuple[str, int]]:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait(self._set, timeout_ms)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return []
            raise
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return []
        bus = nvml_bus_id(nvml.nvmlDeviceGetPciInfo(data.device).busId)
        return [(bus, int(data.eventData))]

    def close(self) -> None:
        nvml = self._nvml
        with contextlib.suppress(AttributeError, nvml.NVMLError):
            nvml.nvmlEventSetFree(self._set)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


class NvmlXidFollower(Follower[tuple[str, int]]):
    """A daemon thread waiting on an :class:`XidEventSource`; never touches the event loop. NVML hangs or fails
    when a GPU falls off the bus: the failure is kept in ``error`` and the daemon lives on."""

    def __init__(self, source: XidEventSource, callback: Callable[[list[tuple[str, int]]], None]) -> None:
        super().__init__(
            "nvml-xid-events",
            lambda: source.wait(WAIT_MS),
            callback,
            lambda exc: f"NVML XID events: {exc}",
            "nvml_xid_events",
        )
        self.source = source

    def stop(self, timeout_s: float = 2.0) -> None:
        super().stop(timeout_s)
        self.source.close()

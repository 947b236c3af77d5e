"""NVML XID events as a second source: bus id form, merging with the kernel log, absence."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import pytest

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.environment import Environment
from dgxdoctor.sources.nvml_xid import NvmlEventsUnavailable, nvml_bus_id

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."


class FakeEvents:
    """Stands in for nvmlEventSetWait: returns what the test puts, [] on timeout."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[str, int]] = queue.Queue()
        self.closed = False

    def wait(self, timeout_ms: int) -> list[tuple[str, int]]:
        try:
            return [self.queue.get(timeout=timeout_ms / 1000)]
        except queue.Empty:
            return []

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("00000000:3B:00.0", "0000:3b:00"), (b"00000000:1B:00.0", "0000:1b:00"), ("00000008:01:00.0", "0008:01:00")],
)
def test_nvml_bus_id_matches_the_kernel_log_form(raw: str | bytes, expected: str) -> None:
    assert nvml_bus_id(raw) == expected


def test_bad_bus_id_names_it() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        nvml_bus_id("GPU-0b11d014")


def _wait(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_nvml_and_kernel_log_report_one_event_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    fake = FakeEvents()
    check = XidCheck(XidSettings(nvml_events=True), Environment(kmsg_path=log), nvml_events_factory=lambda: fake)
    check.start_following()
    try:
        fake.queue.put(("0000:3b:00", 79))
        _wait(lambda: check.count("0000:3b:00", 79) == 1)
        with log.open("a") as fh:
            fh.write(XID_79 + "\n")
        fake.queue.put(("0000:1b:00", 48))  # NVML alone: counted
        _wait(lambda: check.count("0000:1b:00", 48) == 1)
        _wait(lambda: check.reader.stats.records == 1)
        result = check.run()
    finally:
        check.stop()
    assert fake.closed
    assert check.count("0000:3b:00", 79) == 1
    finding = next(f for f in result.findings if f.code == "XID_79")
    assert finding.evidence == XID_79  # the kernel log's line replaces NVML's bare event
    assert next(f for f in result.findings if f.code == "XID_48").subject == "0000:1b:00"


def test_nvml_unavailable_leaves_the_kernel_log_working(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID_79 + "\n")

    def no_nvml() -> FakeEvents:
        raise NvmlEventsUnavailable("NVML did not initialise: Driver Not Loaded")

    check = XidCheck(XidSettings(nvml_events=True), Environment(kmsg_path=log), nvml_events_factory=no_nvml)
    check.start_following()
    try:
        _wait(lambda: check.count("0000:3b:00", 79) == 1)
        result = check.run()
    finally:
        check.stop()
    assert check.count("0000:3b:00", 79) == 1
    assert "NVML XID events unavailable: NVML did not initialise" in result.summary

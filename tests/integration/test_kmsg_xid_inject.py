"""Real XID lines written into /dev/kmsg are seen and counted by the following xid check.

Root can write to /dev/kmsg; each write becomes a kernel log record every reader sees. The kernel
rate-limits writers to 10 lines per 5 s per open descriptor, so each line gets its own descriptor and
nothing (printk_devkmsg) is changed. The line is NVIDIA's XID 63 as printed in the wild (see
tests/fixtures/kernel_log/SOURCES.md): an IGNORE-class XID, so what stays in this machine's kernel log
afterwards makes no other test's check fail. A random bus id keeps runs apart.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status

KMSG = Path("/dev/kmsg")
XID_63 = "NVRM: Xid (PCI:{bus}): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.\n"

pytestmark = pytest.mark.integration


def _write_line(line: str) -> None:
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@pytest.fixture
def kmsg_writable() -> None:
    if not KMSG.exists():
        pytest.skip("no /dev/kmsg on this machine")
    try:
        _write_line("dgxdoctor: xid integration test starting\n")
    except OSError as exc:
        pytest.skip(f"the kernel refuses writes to /dev/kmsg here ({exc.strerror}); needs root")


def _wait_for(check: XidCheck, bus: str, count: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = check.count(bus, 63)
        if seen >= count:
            return seen
        time.sleep(0.01)
    return check.count(bus, 63)


def test_written_xid_lines_are_counted_by_the_follower(kmsg_writable: None) -> None:
    bus = f"0000:{random.randrange(0x80, 0xFF):02x}:{random.randrange(0, 0x20):02x}"
    check = XidCheck(XidSettings(), Environment(kmsg_path=KMSG))
    check.start_following()
    try:
        for _ in range(12):  # more than the 10-lines-per-descriptor burst the kernel allows
            _write_line(XID_63.format(bus=bus))
        assert _wait_for(check, bus, 12) == 12
        result = check.run()
    finally:
        check.stop()
    counters = {
        s.labels["xid"]: s.value
        for s in result.samples
        if s.metric.name == "dgxdoctor_xid_errors_total" and s.labels["pci_bus_id"] == bus
    }
    assert counters == {"63": 12.0}
    finding = next(f for f in result.findings if f.subject == bus)
    assert finding.status == Status.OK  # IGNORE class: counted, not alarming
    assert check.reader.is_device


def test_one_shot_check_reads_the_buffer_since_boot(kmsg_writable: None) -> None:
    bus = f"0000:{random.randrange(0x80, 0xFF):02x}:{random.randrange(0x20, 0x40):02x}"
    _write_line(XID_63.format(bus=bus))
    check = XidCheck(XidSettings(), Environment(kmsg_path=KMSG))
    try:
        check.run()
        assert check.count(bus, 63) == 1
    finally:
        check.stop()

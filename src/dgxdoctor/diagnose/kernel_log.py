"""`dgxdoctor diagnose` for kernel logs (dmesg, journalctl -k, syslog): NVIDIA XID and NVSwitch SXID errors, and
the faults beyond them (sources/kernel_events.py, judged by judge/kernel.py as the live xid check does).

A paste is a kernel log when it names a fault of the kernel's, or when its lines are the kernel's
(sources/kernel_lines.py): most of its first lines carry a kernel log's prefix (a dmesg stamp, ``host kernel:``,
``kern  :info  :``, a /dev/kmsg record) and at least one of them names the kernel or has its shape; or it is a few
bare lines, each one the kernel parsers know (an ``Link ACTIVE``, a templated message). A healthy one is "ok, no XID
or SXID errors", not unrecognised input.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.kernel import RECOVERS, KernelTally, tally_finding
from dgxdoctor.judge.kernel_families import assess_message
from dgxdoctor.judge.xid import DEFAULT_APP_LEVEL_XIDS, assess_sxid, assess_xid, escalate
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.device_map import DeviceMap
from dgxdoctor.sources.kernel_events import RECOVERY_KINDS, KernelEvent, parse_kernel_event, scan_kernel_text
from dgxdoctor.sources.kernel_lines import kernel_line
from dgxdoctor.sources.xid import SxidEvent, XidEvent, load_catalog, scan_text

# Repeats in a pasted log have no reliable clock; the same XID on the same GPU this often escalates.
REPEAT_THRESHOLD = 3
# The lines a paste's shape is judged on (its head: the cost of a detection stays flat whatever the size).
SHAPE_LINES = 400
# A bare paste (no prefix) is read line by line with the kernel parsers only this short.
BARE_LINES = 20


class KernelLogAnalyzer:
    kind: ClassVar[str] = "kernel-log"

    def detect(self, text: str) -> bool:
        if "NVRM: Xid" in text or "SXid (" in text or ("NVRM:" in text and "fallen off the bus" in text):
            return True
        # Only the lines a parser's pattern or a format of the kernel's table may name are parsed (most: none).
        if any(_names_a_fault(event) for event in scan_kernel_text(text)):
            return True
        return kernel_shaped(text)

    def analyze(self, text: str) -> Diagnosis:
        catalog = load_catalog()
        events = scan_text(text)
        xid_events: list[dict[str, Any]] = []
        sxid_events: list[dict[str, Any]] = []
        groups: dict[tuple[str, str, int], list[XidEvent | SxidEvent]] = {}
        for event in events:
            if isinstance(event, XidEvent):
                entry = catalog.xid(event.xid)
                xid_events.append(
                    {
                        "pci_bus_id": event.pci_bus_id,
                        "xid": event.xid,
                        "name": entry.name,
                        "resolution": entry.resolution,
                        "line": event.line,
                    }
                )
                groups.setdefault(("xid", event.pci_bus_id, event.xid), []).append(event)
            else:
                sentry = catalog.sxid(event.sxid)
                sxid_events.append(
                    {
                        "pci_bus_id": event.pci_bus_id,
                        "sxid": event.sxid,
                        "name": sentry.name if sentry else ("fatal" if event.fatal else "non-fatal"),
                        "resolution": sentry.resolution if sentry else ("RESET_FABRIC" if event.fatal else "IGNORE"),
                        "line": event.line,
                    }
                )
                groups.setdefault(("sxid", event.pci_bus_id, event.sxid), []).append(event)

        findings: list[Finding] = []
        for (family, bus, code), group in groups.items():
            last = group[-1]
            if isinstance(last, XidEvent):
                entry = catalog.xid(code)
                assessment = escalate(assess_xid(last, entry, DEFAULT_APP_LEVEL_XIDS), len(group), REPEAT_THRESHOLD)
                message = f"XID {code} ({entry.name}) on {bus}: {len(group)} time(s)"
            else:
                assessment = assess_sxid(last, catalog.sxid(code))
                message = f"SXID {code} on {last.device} {bus}: {len(group)} time(s)"
                if not last.severity_known:
                    message += " (only its Severity/Data line is in the paste: severity from the catalog)"
            findings.append(
                Finding(
                    f"{family.upper()}_{code}",
                    assessment.status,
                    message,
                    bus,
                    evidence=last.line,
                    remedy=assessment.remedy,
                )
            )
        kernel, kernel_events = _kernel_findings(text)
        findings += kernel
        if not groups and all(f.status is Status.OK for f in findings):  # nothing, or INFO messages only
            findings.append(Finding("NO_XID_EVENTS", Status.OK, "no XID or SXID errors in this log"))
        data = {"xid_events": xid_events, "sxid_events": sxid_events, "kernel_events": kernel_events}
        return Diagnosis(self.kind, tuple(findings), data)


def kernel_shaped(text: str) -> bool:
    """Whether ``text``'s lines are the kernel's, faults or not: at least half of its first ``SHAPE_LINES`` lines
    (blank and indented continuation lines aside) carry a kernel log's prefix and one of them names the kernel or
    has its message shape; or, with no prefix, each of its few lines is one the kernel parsers know."""
    head: list[str] = []
    cut = text[: SHAPE_LINES * 1024]  # the head only: a detection costs the same on a 1 GB log
    for line in cut.splitlines():
        if line.strip() and line[:1] not in (" ", "\t"):
            head.append(line)
            if len(head) == SHAPE_LINES:
                break
    if not head:
        return False
    said = [kernel_line(line) for line in head]
    prefixed = sum(s is not None for s in said)
    if prefixed:
        return 2 * prefixed >= len(head) and any(said)
    if len(head) > BARE_LINES or len(cut) < len(text):
        return False
    return all(parse_kernel_event(line) is not None for line in head)


def _names_a_fault(event: KernelEvent) -> bool:
    """A fault of a parser's kind, or a templated message its family judges a warning (an INFO-only message alone
    does not make a paste a kernel log)."""
    if event.kind == "kernel_message":
        return assess_message(event.family, event.level).status is not Status.OK
    return event.kind not in RECOVERY_KINDS


def _kernel_findings(text: str) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The faults beyond XIDs, one finding per (kind, device) as the live check tallies them (a paste has no
    clock: no ages, and a recovery counts when its line comes after the fault's)."""
    devices = DeviceMap()  # a paste comes from another machine: devices are named as the lines name them
    tallies: dict[tuple[str, str], KernelTally] = {}
    events: list[dict[str, Any]] = []
    for event in scan_kernel_text(text):
        device = devices.resolve(event.pci, event.netdev, event.other)
        label = device.label if device else ""
        if event.kind in RECOVERY_KINDS:
            fault = tallies.get((RECOVERS[event.kind], label))
            if fault is not None:
                fault.recovered_at = 0.0
            continue
        events.append({"kind": event.key, "device": label, "line": event.line})
        tally = tallies.get((event.key, label))
        if tally is None:
            tallies[(event.key, label)] = KernelTally(1, 0.0, event, device)
        else:
            tally.count, tally.event, tally.recovered_at = tally.count + 1, event, None
    return [tally_finding(kind, t, None) for (kind, _), t in tallies.items()], events

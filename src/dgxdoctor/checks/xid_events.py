"""The xid check's memory: every XID and SXID seen since the agent started, per (device, code), from the kernel
log and NVML's event stream, with the rules that make two reports of one event count once. Thread-safe: the
followers write, ``run()`` reads a snapshot. State only: ``judge/xid.py`` decides what the tallies mean.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dgxdoctor.sources.kmsg import KmsgRecord
from dgxdoctor.sources.xid import KernelLogScanner, SxidEvent, XidEvent

# The driver prints "Xid 79" and "GPU ... has fallen off the bus" together; within this many seconds the
# two are one event.
FALLEN_OFF_MERGE_S = 30.0
# An NVML XID event and the kernel log line of the same XID on the same GPU within this many seconds are
# one event (the driver raises both).
CROSS_SOURCE_MERGE_S = 5.0
# Event times kept per (GPU, XID) for the repeat window; a storm beyond this is "at least this many".
MAX_TIMES_KEPT = 1024

Key = tuple[str, int]  # (PCI bus id, XID or SXID code)


@dataclass
class Tally:
    """Events of one (device, code): count since start, times for the repeat window, the latest line."""

    count: int
    last_seen: float
    last_event: XidEvent | SxidEvent
    times: deque[float]

    def copy(self) -> Tally:
        return Tally(self.count, self.last_seen, self.last_event, deque(self.times))


class XidLedger:
    """Tallies of XIDs and SXIDs. ``clock`` gives wall time, ``monotonic`` the time since boot (for kmsg stamps).

    ``merge_nvml``: NVML's events are followed too, so a kernel log line and an NVML event of the same XID on the
    same GPU within ``CROSS_SOURCE_MERGE_S`` count once.
    """

    def __init__(self, clock: Callable[[], float], monotonic: Callable[[], float], merge_nvml: bool) -> None:
        self._clock = clock
        self._monotonic = monotonic
        self._merge_nvml = merge_nvml
        self._scanner = KernelLogScanner()
        self._lock = threading.Lock()
        self._unpaired: dict[Key, deque[tuple[float, str]]] = {}
        self._recent_79: dict[str, tuple[float, bool]] = {}  # bus -> (time, synthesized)
        self._xids: dict[Key, Tally] = {}
        self._sxids: dict[Key, Tally] = {}
        self.min_usec: int | None = None  # records stamped before this (lookback_s) are ignored

    def ingest(self, records: list[KmsgRecord]) -> None:
        """Fold kernel log records in (the kmsg follower's callback)."""
        now = self._clock()
        boot_wall = now - self._monotonic()
        with self._lock:
            for record in records:
                if self.min_usec is not None and record.usec is not None and record.usec < self.min_usec:
                    continue
                when = boot_wall + record.usec / 1e6 if record.usec is not None else now
                for line in record.lines:
                    for event in self._scanner.feed(line):
                        self._count(event, when)

    def ingest_nvml(self, events: list[tuple[str, int]]) -> None:
        """Fold NVML XID events in (the NVML follower's callback)."""
        when = self._clock()
        with self._lock:
            for bus, code in events:
                event = XidEvent(bus, code, f"NVML XID event: Xid {code} on {bus}", detail="reported by NVML")
                if not self._merge_sources((bus, code), "nvml", when):
                    _tally(self._xids, (bus, code), event, when)

    def count(self, pci_bus_id: str, xid: int) -> int:
        with self._lock:
            tally = self._xids.get((pci_bus_id, xid))
            return tally.count if tally else 0

    def snapshot(self) -> tuple[list[tuple[Key, Tally]], list[tuple[Key, Tally]]]:
        """(XIDs, SXIDs), sorted, copied: the followers keep counting meanwhile."""
        with self._lock:
            xids = sorted((key, t.copy()) for key, t in self._xids.items())
            sxids = sorted((key, t.copy()) for key, t in self._sxids.items())
        return xids, sxids

    def _count(self, event: XidEvent | SxidEvent, when: float) -> None:
        if isinstance(event, SxidEvent):
            _tally(self._sxids, (event.pci_bus_id, event.sxid), event, when)
            return
        if event.xid == 79 and self._merge_fallen_off(event, when):
            return
        key = (event.pci_bus_id, event.xid)
        if self._merge_nvml and self._merge_sources(key, "kmsg", when):
            tally = self._xids.get(key)
            if tally is not None:  # the kernel log's line is the better evidence
                tally.last_event = event
            return
        _tally(self._xids, key, event, when)

    def _merge_sources(self, key: Key, source: str, when: float) -> bool:
        """True when the other source already reported this XID on this GPU (counted once)."""
        pending = self._unpaired.setdefault(key, deque())
        while pending and when - pending[0][0] > CROSS_SOURCE_MERGE_S:
            pending.popleft()
        for i, (seen, other) in enumerate(pending):
            if other != source and abs(when - seen) <= CROSS_SOURCE_MERGE_S:
                del pending[i]
                return True
        pending.append((when, source))
        return False

    def _merge_fallen_off(self, event: XidEvent, when: float) -> bool:
        """True when this 79 is the other half of one already counted (Xid line + fallen-off line)."""
        previous = self._recent_79.get(event.pci_bus_id)
        self._recent_79[event.pci_bus_id] = (when, event.synthesized)
        if previous is None or abs(when - previous[0]) > FALLEN_OFF_MERGE_S:
            return False
        if previous[1] == event.synthesized:
            return False  # two Xid 79 lines (or two fallen-off lines) are two events
        if not event.synthesized:  # keep the real Xid line as the evidence
            tally = self._xids.get((event.pci_bus_id, 79))
            if tally is not None:
                tally.last_event = event
        return True


def _tally(table: dict[Key, Tally], key: Key, event: XidEvent | SxidEvent, when: float) -> None:
    tally = table.get(key)
    if tally is None:
        table[key] = Tally(1, when, event, deque([when], maxlen=MAX_TIMES_KEPT))
        return
    tally.count += 1
    tally.last_seen = max(tally.last_seen, when)
    tally.last_event = event
    tally.times.append(when)

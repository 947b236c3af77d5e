"""The xid check's memory: every XID and SXID seen since the agent started, per (device, code), from the kernel
log and NVML's event stream, with the rules that make two reports of one event count once. Thread-safe: the
followers write, ``run()`` reads a snapshot. State only: ``judge/xid.py`` decides what the tallies mean.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from msgspec import Struct

from dgxdoctor.sources.kmsg import KmsgRecord, records_since
from dgxdoctor.sources.xid import FallenOffMerge, KernelLogScanner, SxidEvent, XidEvent

# An NVML XID event and the kernel log line of the same XID on the same GPU within this many seconds are
# one event (the driver raises both).
CROSS_SOURCE_MERGE_S = 5.0
# Event times kept per (GPU, XID) for the repeat window; a storm beyond this is "at least this many".
MAX_TIMES_KEPT = 1024

Key = tuple[str, int]  # (PCI bus id, XID or SXID code)


class Tally(Struct):
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
        self._fallen_off = FallenOffMerge()
        self._xids: dict[Key, Tally] = {}
        self._sxids: dict[Key, Tally] = {}
        self.min_usec: int | None = None  # records stamped before this (lookback_s) are ignored
        self.counted = 0  # events counted so far (XIDs and SXIDs), so a caller can tell that something new came
        self.first_wall: float | None = None  # Unix time of the first kernel record folded in
        self.restored = 0  # times tallies from before a restart were taken up (part of "changed since saved")

    def restore(self, xids: dict[Key, Tally], sxids: dict[Key, Tally]) -> None:
        """Take up tallies remembered from before a restart (checks/xid_memory.py)."""
        with self._lock:
            self._xids.update(xids)
            self._sxids.update(sxids)
            self.restored += 1

    def ingest(self, records: list[KmsgRecord]) -> int:
        """Fold kernel log records in (the kmsg follower's callback); returns how many events were counted."""
        now = self._clock()
        boot_wall = now - self._monotonic()
        with self._lock:
            before = self.counted
            for record in records_since(records, self.min_usec):
                when = boot_wall + record.usec / 1e6 if record.usec is not None else now
                if self.first_wall is None:
                    self.first_wall = when
                for line in record.lines:
                    for event in self._scanner.feed(line):
                        self._count(event, when)
            return self.counted - before

    def ingest_nvml(self, events: list[tuple[str, int]]) -> int:
        """Fold NVML XID events in (the NVML follower's callback); returns how many were counted."""
        when = self._clock()
        with self._lock:
            before = self.counted
            for bus, code in events:
                event = XidEvent(bus, code, f"NVML XID event: Xid {code} on {bus}", detail="reported by NVML")
                if not self._merge_sources((bus, code), "nvml", when):
                    self._add(self._xids, (bus, code), event, when)
            return self.counted - before

    def _add(self, table: dict[Key, Tally], key: Key, event: XidEvent | SxidEvent, when: float) -> None:
        self.counted += 1
        _tally(table, key, event, when)

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
            self._add(self._sxids, (event.pci_bus_id, event.sxid), event, when)
            return
        if event.xid == 79 and self._merge_fallen_off(event, when):
            return
        key = (event.pci_bus_id, event.xid)
        if self._merge_nvml and self._merge_sources(key, "kmsg", when):
            tally = self._xids.get(key)
            if tally is not None:  # the kernel log's line is the better evidence
                tally.last_event = event
            return
        self._add(self._xids, key, event, when)

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
        """True when this 79 line belongs to one already counted (sources.xid.FallenOffMerge)."""
        verdict = self._fallen_off.classify(event, when)
        if verdict == "better_evidence":  # keep the real Xid line as the evidence
            tally = self._xids.get((event.pci_bus_id, 79))
            if tally is not None:
                tally.last_event = event
        return verdict != "new"


def _tally(table: dict[Key, Tally], key: Key, event: XidEvent | SxidEvent, when: float) -> None:
    tally = table.get(key)
    if tally is None:
        table[key] = Tally(1, when, event, deque([when], maxlen=MAX_TIMES_KEPT))
        return
    tally.count += 1
    tally.last_seen = max(tally.last_seen, when)
    tally.last_event = event
    tally.times.append(when)

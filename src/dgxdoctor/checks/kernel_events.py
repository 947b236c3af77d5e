"""The xid check's second tally: kernel faults beyond XIDs (sources/kernel_events.py), per (kind, device), fed by
the same followed kernel log. Thread-safe: the follower writes, ``run()`` reads. Verdicts are judge/kernel.py's.

A recovery line (``Link up``, ``nfs: server ... OK``) counts nowhere; it marks the earlier fault of the same device
as recovered when it comes after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from msgspec.structs import fields, replace

from dgxdoctor.judge.kernel import RECOVERS, WARNING_LEVEL, KernelTally, tally_finding
from dgxdoctor.records import asdict
from dgxdoctor.result import MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.device_map import Device, DeviceMap
from dgxdoctor.sources.kernel_events import RECOVERY_KINDS, KernelEvent, KernelJoiner
from dgxdoctor.sources.kmsg import KmsgRecord, records_since

KERNEL_EVENTS_TOTAL = MetricSpec(
    "dgxdoctor_kernel_events_total",
    "Kernel log faults beyond XIDs seen this boot since the agent started, per kind (mlx5_cmd_timeout, link_down, "
    "aer_fatal, oom_kill, nfs_not_responding, ...) and the device the line names (an RDMA device, a PCI address, "
    "an interface; empty when it names none)",
    "counter",
    ("kind", "device"),
)


class KernelEventLedger:
    def __init__(self, clock: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str], KernelTally] = {}
        self.devices = DeviceMap()
        self._joiner = KernelJoiner()  # one report, one fault: the same joining as ``diagnose``
        self.min_usec: int | None = None
        self.counted = 0  # faults counted and recoveries noted, so a caller can tell that something changed

    def ingest(self, records: list[KmsgRecord]) -> int:
        """Fold kernel log records in; returns how many faults (and recoveries) were noted."""
        now = self._clock()
        boot_wall = now - self._monotonic()
        with self._lock:
            before = self.counted
            when = now
            for record in records_since(records, self.min_usec):
                when = boot_wall + record.usec / 1e6 if record.usec is not None else now
                # The kernel's table holds messages at warning level and above: a record the kernel logged at
                # notice, info or debug prints none of them (and is not looked up: most of a kmsg flood).
                templates = record.level is None or record.level <= WARNING_LEVEL
                for line in record.lines:
                    for event in self._joiner.feed(line, templates):
                        self._count(event, when)
            for event in self._joiner.flush():  # a head whose report ends here
                self._count(event, when)
            return self.counted - before

    def _count(self, event: KernelEvent, when: float) -> None:
        device = self.devices.resolve(event.pci, event.netdev, event.other)
        label = device.label if device else ""
        if event.kind in RECOVERY_KINDS:
            fault = self._tallies.get((RECOVERS[event.kind], label))
            if fault is not None and when >= fault.last_seen:
                fault.recovered_at = when
                self.counted += 1  # not a fault, but a change the memory across restarts must keep
            return
        tally = self._tallies.get((event.key, label))
        self.counted += 1
        if tally is None:
            self._tallies[(event.key, label)] = KernelTally(1, when, event, device)
            return
        tally.count += 1
        tally.last_seen = max(tally.last_seen, when)
        tally.event, tally.device = event, device
        if tally.recovered_at is not None and when > tally.recovered_at:
            tally.recovered_at = None  # down again after it came back

    def to_docs(self) -> list[dict[str, Any]]:
        """The tallies as plain documents, for the xid check's memory across restarts (checks/xid_memory.py)."""
        return [
            {"kind": kind, "label": label, "count": t.count, "last_seen": t.last_seen, "recovered_at": t.recovered_at,
             "event": asdict(t.event), "device": asdict(t.device) if t.device else None}
            for (kind, label), t in self.snapshot()
        ]  # fmt: skip

    def restore(self, docs: list[dict[str, Any]]) -> None:
        """Take up tallies remembered from before a restart; a document of the wrong shape is dropped."""
        with self._lock:
            for doc in docs:
                tally = _tally_from_doc(doc)
                if tally is not None:
                    self._tallies[(tally.event.key, str(doc["label"]))] = tally

    def snapshot(self) -> list[tuple[tuple[str, str], KernelTally]]:
        with self._lock:
            return sorted((key, replace(t)) for key, t in self._tallies.items())

    def report(
        self, b: ResultBuilder, now: float, cleared: Callable[[float], bool], owners: frozenset[int] | None = None
    ) -> list[str]:
        """Counter samples and findings into ``b``; returns the summary's words for each fault that is not OK.
        ``owners``: the users whose OOM-killed tasks may be serving processes (``judge.kernel.tally_finding``)."""
        words: list[str] = []
        for (kind, label), tally in self.snapshot():
            b.sample(KERNEL_EVENTS_TOTAL, tally.count, kind=kind, device=label)
            if cleared(tally.last_seen):
                continue
            finding = tally_finding(kind, tally, now, owners)
            b.add(finding)
            if finding.status in (Status.WARNING, Status.CRITICAL):
                words.append(f"{kind} on {label} x{tally.count}" if label else f"{kind} x{tally.count}")
        return words


def _tally_from_doc(doc: dict[str, Any]) -> KernelTally | None:
    try:
        names = {f.name for f in fields(KernelEvent)}
        event = KernelEvent(**{k: v for k, v in doc["event"].items() if k in names})
        device = Device(**doc["device"]) if isinstance(doc.get("device"), dict) else None
        count, last_seen, recovered = int(doc["count"]), float(doc["last_seen"]), doc.get("recovered_at")
        if not isinstance(doc["label"], str) or event.key != doc["kind"] or count < 1:
            return None
        return KernelTally(count, last_seen, event, device, float(recovered) if recovered is not None else None)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None

"""What the xid check remembers across a restart of the daemon: ``<state_dir>/xid.json``.

The kernel's ring buffer is the only record of an XID, and it is small: a burst of other messages pushes early
records out. A daemon that restarts (SIGKILL, upgrade, OOM) and reads the buffer again would report fewer events, or
none of the "fallen off the bus" XIDs that mattered most. So the daemon keeps, per boot, its tallies, the sequence
number of the last kernel record it has read and where its window began, written atomically (``StateFile``) after
each run in which something changed. After a restart in the same boot it resumes after that sequence number:
nothing is counted twice, and records that left the buffer while it was down are counted as lost (the gap in
sequence numbers). A memory from another boot is dropped: XID counts are per boot, as the kernel's are.

The window is stated truthfully: "since boot" only when the first record read was the boot's first (sequence 0) or
the memory of this boot began there; otherwise the window begins at the first record read, and the records of this
boot that had already left the buffer are counted as lost.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

from msgspec import Struct, field
from msgspec.structs import fields

from dgxdoctor.checks.xid_events import MAX_TIMES_KEPT, Key, Tally
from dgxdoctor.records import asdict
from dgxdoctor.sources.statefile import StateFile
from dgxdoctor.sources.xid import SxidEvent, XidEvent

STATE_FILE_NAME = "xid.json"
VERSION = 1
MAX_ENTRIES = 4096


class Memory(Struct):
    """The state of one boot: tallies, the last record read, the window's start, records lost."""

    boot_id: str | None
    last_seq: int | None = None
    from_boot: bool = False
    window_start: float | None = None  # Unix time of the window's first record (None: from boot)
    lost: int = 0
    xids: dict[Key, Tally] = field(default_factory=dict)
    sxids: dict[Key, Tally] = field(default_factory=dict)
    # Kernel faults beyond XIDs (checks/kernel_events.py ``to_docs``/``restore``), kept as plain documents.
    kernel: list[dict[str, Any]] = field(default_factory=list)


def _tally_doc(key: Key, tally: Tally) -> dict[str, Any]:
    return {
        "bus": key[0],
        "code": key[1],
        "count": tally.count,
        "last_seen": tally.last_seen,
        "times": list(tally.times),
        "event": asdict(tally.last_event),
    }


def _event(doc: Any, cls: type[XidEvent] | type[SxidEvent]) -> XidEvent | SxidEvent | None:
    if not isinstance(doc, dict):
        return None
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in doc.items() if k in names})
    except TypeError:
        return None


def _tallies(docs: Any, cls: type[XidEvent] | type[SxidEvent]) -> dict[Key, Tally]:
    """Entries that do not have the expected shape are dropped (a damaged file costs history, not the check)."""
    out: dict[Key, Tally] = {}
    if not isinstance(docs, list):
        return out
    for doc in docs[:MAX_ENTRIES]:
        if not isinstance(doc, dict):
            continue
        bus, code, count, last_seen, times = (doc.get(k) for k in ("bus", "code", "count", "last_seen", "times"))
        event = _event(doc.get("event"), cls)
        if not isinstance(bus, str) or not _int(code) or not _int(count) or not _num(last_seen) or event is None:
            continue
        kept = [float(t) for t in times if _num(t)] if isinstance(times, list) else []
        out[(bus, code)] = Tally(count, float(last_seen), event, deque(kept[-MAX_TIMES_KEPT:], maxlen=MAX_TIMES_KEPT))
    return out


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def state_file(state_dir: Path) -> StateFile:
    """The memory's file, in this release's format."""
    return StateFile(state_dir / STATE_FILE_NAME, version=VERSION)


def load(statefile: StateFile, boot_id: str | None) -> Memory | None:
    """This boot's memory, or None (no file, another boot, unknown boot). ``statefile`` migrated an older format
    (``state_file``); a newer one is read for the keys this release knows, each checked as it is read."""
    doc = statefile.load()
    if not doc or boot_id is None or doc.get("boot_id") != boot_id:
        return None
    last_seq = doc.get("last_seq")
    window_start = doc.get("window_start")
    lost = doc.get("lost")
    return Memory(
        boot_id=boot_id,
        last_seq=last_seq if _int(last_seq) else None,
        from_boot=doc.get("from_boot") is True,
        window_start=float(window_start) if _num(window_start) else None,
        lost=lost if _int(lost) else 0,
        xids=_tallies(doc.get("xids"), XidEvent),
        sxids=_tallies(doc.get("sxids"), SxidEvent),
        kernel=[d for d in doc.get("kernel") or [] if isinstance(d, dict)][:MAX_ENTRIES],
    )


def save(statefile: StateFile, memory: Memory) -> bool:
    """Write atomically; False when the write failed (logged and counted by ``StateFile``)."""

    def docs(table: dict[Key, Tally]) -> Iterable[dict[str, Any]]:
        return [_tally_doc(key, tally) for key, tally in sorted(table.items())]

    return statefile.save(
        {
            "version": VERSION,
            "boot_id": memory.boot_id,
            "last_seq": memory.last_seq,
            "from_boot": memory.from_boot,
            "window_start": memory.window_start,
            "lost": memory.lost,
            "xids": list(docs(memory.xids)),
            "sxids": list(docs(memory.sxids)),
            "kernel": memory.kernel,
        }
    )

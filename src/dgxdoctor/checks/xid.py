"""NVIDIA XID and NVSwitch SXID errors from the kernel log.

By hand: ``dmesg -T | grep -E 'NVRM: Xid|SXid|fallen off the bus'`` (or ``journalctl -k -g Xid``).

One-shot (``dgxdoctor check``): reads the kernel log buffer since boot (or the last ``lookback_s``).
In the daemon, :meth:`XidCheck.start` (called by the runner before the first run) follows the log until
:meth:`XidCheck.stop`: a daemon thread folds each new record in within milliseconds (see sources/kmsg.py) and,
when it counted an XID or SXID, asks the daemon to run the check at once (``env.fleet.wake``), so /metrics and
/state show it without waiting for the interval; ``run()`` only reports the state. When not following, each
``run()`` reads what is new since the previous run.
Counters are monotonic since the agent started (the first read takes the whole buffer since boot) and not
persisted: a restart reads the buffer again, and Prometheus treats the drop as a counter reset.

Severity comes from the catalog's resolution (data/xid_catalog.json, NVIDIA's Xid catalog): reset,
reboot or support is CRITICAL, restart-the-application is WARNING, IGNORE is OK. Application-level XIDs
(13, 31, 43, 45 by default) are WARNING whatever the catalog says. The same XID on the same GPU
``repeat_threshold`` times within ``repeat_window_s`` escalates a WARNING to CRITICAL (IGNORE-class
XIDs stay OK).
``overrides`` sets a status per XID outright.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import structlog
from pydantic import Field, field_validator

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.xid import DEFAULT_APP_LEVEL_XIDS, Assessment, assess_sxid, assess_xid, escalate, worst_action
from dgxdoctor.judge.xid import override as override_status
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.kmsg import KmsgFollower, KmsgReader, KmsgRecord
from dgxdoctor.sources.nvml_xid import NvmlEventsUnavailable, NvmlXidFollower, PynvmlXidEvents, XidEventSource
from dgxdoctor.sources.xid import (
    CatalogEntry,
    KernelLogScanner,
    SxidEvent,
    XidCatalog,
    XidEvent,
    load_catalog,
)

XID_ERRORS_TOTAL = MetricSpec(
    "dgxdoctor_xid_errors_total",
    "NVIDIA XID errors seen in the kernel log per GPU and XID code, since the agent started "
    "(a 'fallen off the bus' line without an Xid line counts as XID 79)",
    "counter",
    ("pci_bus_id", "xid"),
)
XID_LAST_SEEN = MetricSpec(
    "dgxdoctor_xid_last_seen_timestamp_seconds",
    "Unix time of the latest XID error of this code on this GPU",
    "gauge",
    ("pci_bus_id", "xid"),
)
SXID_ERRORS_TOTAL = MetricSpec(
    "dgxdoctor_nvswitch_sxid_errors_total",
    "NVSwitch SXID errors seen in the kernel log per switch and SXID code, since the agent started",
    "counter",
    ("pci_bus_id", "sxid"),
)
SXID_LAST_SEEN = MetricSpec(
    "dgxdoctor_nvswitch_sxid_last_seen_timestamp_seconds",
    "Unix time of the latest SXID error of this code on this NVSwitch",
    "gauge",
    ("pci_bus_id", "sxid"),
)
XID_CATALOG_INFO = MetricSpec(
    "dgxdoctor_xid_catalog_info",
    "NVIDIA's catalog entry of each XID code seen: its name and resolution bucket (RESTART_APP, RESET_GPU, "
    "RESTART_BM, CONTACT_SUPPORT, IGNORE, ...); value 1. Join on xid to group XIDs by what they need.",
    "info",
    ("xid", "name", "resolution"),
)
KMSG_RECORDS_LOST = MetricSpec(
    "dgxdoctor_kmsg_records_lost_total",
    "Kernel log records overwritten before dgxdoctor read them (ring buffer overrun), since the agent started",
    "counter",
)
KMSG_RECORDS_READ = MetricSpec(
    "dgxdoctor_kmsg_records_read_total",
    "Kernel log records read, since the agent started",
    "counter",
)
KMSG_FOLLOWING = MetricSpec(
    "dgxdoctor_kmsg_following",
    "1 when the kernel log is followed by a background reader, 0 when it is read at each run",
)

log = structlog.get_logger(__name__)


# The driver prints "Xid 79" and "GPU ... has fallen off the bus" together; within this many seconds the
# two are one event.
FALLEN_OFF_MERGE_S = 30.0
# An NVML XID event and the kernel log line of the same XID on the same GPU within this many seconds are
# one event (the driver raises both).
CROSS_SOURCE_MERGE_S = 5.0
# Event times kept per (GPU, XID) for the repeat window; a storm beyond this is "at least this many".
MAX_TIMES_KEPT = 1024


class XidSettings(CheckSettings):
    interval_s: float = Field(
        10.0, gt=0, description="daemon: seconds between reports (events are followed, not polled)"
    )
    lookback_s: float | None = Field(
        None,
        gt=0,
        description="only kernel log records newer than this many seconds; unset: the whole buffer since boot",
    )
    app_level_xids: list[int] = Field(
        list(DEFAULT_APP_LEVEL_XIDS),
        description="XIDs caused by the application, WARNING unless repeated (NVIDIA: 13, 31, 43, 45)",
    )
    repeat_threshold: int = Field(
        3,
        ge=2,
        description="this many of the same XID on the same GPU within repeat_window_s escalates a warning to critical",
    )
    repeat_window_s: float = Field(3600.0, gt=0, description="window in seconds for repeat_threshold")
    clear_after_s: float | None = Field(
        None,
        gt=0,
        description="events older than this no longer set the status (they stay counted); unset: until reboot",
    )
    nvml_events: bool = Field(
        False,
        description="daemon: also follow NVML's XID events (the kernel log stays primary; "
        "an event both report is counted once)",
    )
    overrides: dict[str, Literal["ok", "warning", "critical"]] = Field(
        default_factory=dict,
        description='status per XID code, overriding the catalog, e.g. {"13" = "critical", "63" = "ok"}',
    )

    @field_validator("overrides")
    @classmethod
    def _xid_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not (k.isascii() and k.isdigit() and len(k) <= 3 and 0 < int(k) < 1000)]
        if bad:
            raise ValueError(f"keys must be XID numbers 1..999 as strings, got {', '.join(repr(k) for k in bad)}")
        return value

    @field_validator("app_level_xids")
    @classmethod
    def _xid_range(cls, value: list[int]) -> list[int]:
        bad = [x for x in value if not 0 < x < 1000]
        if bad:
            raise ValueError(f"XID numbers are 1..999, got {bad}")
        return value


@dataclass
class _Tally:
    """Events of one (device, code): count since start, times for the repeat window, the latest line."""

    count: int
    last_seen: float
    last_event: XidEvent | SxidEvent
    times: deque[float]


class XidCheck(Check):
    name: ClassVar[str] = "xid"
    settings_model: ClassVar[type[CheckSettings]] = XidSettings

    def __init__(
        self,
        settings: CheckSettings,
        env: Environment,
        catalog: XidCatalog | None = None,
        nvml_events_factory: Callable[[], XidEventSource] = PynvmlXidEvents,
    ) -> None:
        settings = own_settings(self.name, settings, XidSettings)
        self.settings: CheckSettings = settings
        self.cfg: XidSettings = settings
        self.env = env
        self.catalog = catalog or load_catalog()
        self.reader = KmsgReader(env.kmsg_path)
        self._scanner = KernelLogScanner()
        self._follower: KmsgFollower | None = None
        self._nvml_factory = nvml_events_factory
        self._nvml_follower: NvmlXidFollower | None = None
        self._nvml_note: str | None = None
        self._unpaired: dict[tuple[str, int], deque[tuple[float, str]]] = {}
        self._lock = threading.Lock()
        self._min_usec: int | None = None
        self._opened = False
        self._xids: dict[tuple[str, int], _Tally] = {}
        self._sxids: dict[tuple[str, int], _Tally] = {}
        self._recent_79: dict[str, tuple[float, bool]] = {}  # bus -> (time, synthesized)
        self.events_seen = 0  # for tests and the latency benchmark

    # --- daemon API ---------------------------------------------------------------------------------

    def start(self) -> None:
        """The daemon follows the kernel log; the one-shot run reads it in ``run()`` instead."""
        if not self.env.one_shot:
            self.start_following()

    def start_following(self) -> None:
        """Follow the kernel log in a daemon thread; new events are folded in within a second.

        The follower is a thread (a blocking read cannot be interrupted; a poll() with a short timeout can), so
        it never runs on, nor blocks, the event loop. Raises OSError (no such file, permission denied) for the
        caller to log; the daemon keeps running and ``run()`` then reports the problem (SKIPPED or UNKNOWN).
        """
        if self._follower is not None and self._follower.running:
            return
        if self.cfg.nvml_events and self._nvml_follower is None:
            self._start_nvml()
        self._open()
        self._follower = KmsgFollower(self.reader, self.ingest)
        self._follower.start()

    def _start_nvml(self) -> None:
        try:
            source = self._nvml_factory()
        except NvmlEventsUnavailable as exc:
            self._nvml_note = f"NVML XID events unavailable: {exc}"
            log.warning("nvml_xid_events_unavailable", error=str(exc))
            return
        self._nvml_note = None
        self._nvml_follower = NvmlXidFollower(source, self.ingest_nvml)
        self._nvml_follower.start()

    def stop(self) -> None:
        """Stop following and close the kernel log (and NVML's event set)."""
        if self._nvml_follower is not None:
            self._nvml_follower.stop()
            self._nvml_follower = None
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
        self.reader.close()
        self._opened = False

    @property
    def following(self) -> bool:
        return self._follower is not None and self._follower.running

    # --- ingest -------------------------------------------------------------------------------------

    def _open(self) -> None:
        if self._opened:
            return
        self.reader.open()
        if self.cfg.lookback_s is not None:
            self._min_usec = int((self.env.monotonic() - self.cfg.lookback_s) * 1e6)
        self._opened = True

    def ingest(self, records: list[KmsgRecord]) -> None:
        """Fold kernel log records in (the follower's callback; also usable directly)."""
        now = self.env.clock()
        boot_wall = now - self.env.monotonic()
        with self._lock:
            before = self.events_seen
            for record in records:
                if self._min_usec is not None and record.usec is not None and record.usec < self._min_usec:
                    continue
                when = boot_wall + record.usec / 1e6 if record.usec is not None else now
                for line in record.lines:
                    for event in self._scanner.feed(line):
                        self._count(event, when)
            counted = self.events_seen != before
        if counted:
            self._wake()

    def ingest_nvml(self, events: list[tuple[str, int]]) -> None:
        """Fold NVML XID events in (the NVML follower's callback)."""
        when = self.env.clock()
        with self._lock:
            before = self.events_seen
            for bus, code in events:
                event = XidEvent(bus, code, f"NVML XID event: Xid {code} on {bus}", detail="reported by NVML")
                if not self._merge_sources((bus, code), "nvml", when):
                    self._tally(self._xids, (bus, code), event, when)
            counted = self.events_seen != before
        if counted:
            self._wake()

    def _wake(self) -> None:
        """Ask the daemon to run this check now (from the follower's thread)."""
        fleet = self.env.fleet
        if fleet is None:
            return
        try:
            fleet.wake(self.name)
        except Exception as exc:  # the follower must keep reading whatever the daemon's side does
            log.warning("xid_wake_failed", error=f"{type(exc).__name__}: {exc}")

    def _count(self, event: XidEvent | SxidEvent, when: float) -> None:
        if isinstance(event, SxidEvent):
            self._tally(self._sxids, (event.pci_bus_id, event.sxid), event, when)
            return
        if event.xid == 79 and self._merge_fallen_off(event, when):
            return
        key = (event.pci_bus_id, event.xid)
        if self.cfg.nvml_events and self._merge_sources(key, "kmsg", when):
            tally = self._xids.get(key)
            if tally is not None:  # the kernel log's line is the better evidence
                tally.last_event = event
            return
        self._tally(self._xids, key, event, when)

    def _merge_sources(self, key: tuple[str, int], source: str, when: float) -> bool:
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

    def _tally(
        self, table: dict[tuple[str, int], _Tally], key: tuple[str, int], event: XidEvent | SxidEvent, when: float
    ) -> None:
        self.events_seen += 1
        tally = table.get(key)
        if tally is None:
            table[key] = _Tally(1, when, event, deque([when], maxlen=MAX_TIMES_KEPT))
            return
        tally.count += 1
        tally.last_seen = max(tally.last_seen, when)
        tally.last_event = event
        tally.times.append(when)

    def count(self, pci_bus_id: str, xid: int) -> int:
        with self._lock:
            tally = self._xids.get((pci_bus_id, xid))
            return tally.count if tally else 0

    # --- run ----------------------------------------------------------------------------------------

    def run(self) -> CheckResult:
        path = self.env.kmsg_path
        if not self.following:
            if not path.exists():
                return CheckResult.skipped(self.name, f"no kernel log at {path}")
            try:
                self._open()
                records = self.reader.read_available()
            except PermissionError as exc:
                raise RuntimeError(f"cannot read {path}: {exc.strerror} (needs root or CAP_SYSLOG)") from None
            self.ingest(records)
        elif self._follower is not None and self._follower.error:
            raise RuntimeError(self._follower.error)
        if self._nvml_follower is not None and self._nvml_follower.error:
            self._nvml_note = self._nvml_follower.error
        return self._report()

    def _report(self) -> CheckResult:
        builder = ResultBuilder(self.name)
        now = self.env.clock()
        actions: list[tuple[Status, Assessment]] = []
        with self._lock:  # a snapshot: the follower thread keeps counting meanwhile
            xids = sorted(
                (key, _Tally(t.count, t.last_seen, t.last_event, deque(t.times))) for key, t in self._xids.items()
            )
            sxids = sorted(
                (key, _Tally(t.count, t.last_seen, t.last_event, deque(t.times))) for key, t in self._sxids.items()
            )
            stats = self.reader.stats
            lost, read = stats.lost, stats.records
        for code in sorted({code for (_, code), _ in xids}):
            entry = self.catalog.xid(code)
            builder.sample(XID_CATALOG_INFO, 1.0, xid=str(code), name=entry.name, resolution=entry.resolution)
        for (bus, code), tally in xids:
            builder.sample(XID_ERRORS_TOTAL, tally.count, pci_bus_id=bus, xid=str(code))
            builder.sample(XID_LAST_SEEN, tally.last_seen, pci_bus_id=bus, xid=str(code))
            event = tally.last_event
            assert isinstance(event, XidEvent)
            entry = self.catalog.xid(code)
            assessment = self._assess(event, entry, tally, now)
            if assessment is None:
                continue
            actions.append((assessment.status, assessment))
            builder.finding(
                f"XID_{code}",
                assessment.status,
                f"XID {code} ({entry.name}) on {bus}: {tally.count} time(s), latest {_ago(now - tally.last_seen)}",
                bus,
                evidence=event.line,
                remedy=assessment.remedy,
            )
        for (bus, code), tally in sxids:
            builder.sample(SXID_ERRORS_TOTAL, tally.count, pci_bus_id=bus, sxid=str(code))
            builder.sample(SXID_LAST_SEEN, tally.last_seen, pci_bus_id=bus, sxid=str(code))
            event = tally.last_event
            assert isinstance(event, SxidEvent)
            if self._cleared(tally, now):
                continue
            sentry = self.catalog.sxid(code)
            assessment = assess_sxid(event, sentry)
            actions.append((assessment.status, assessment))
            label = sentry.name if sentry else ("fatal" if event.fatal else "non-fatal")
            latest = _ago(now - tally.last_seen)
            builder.finding(
                f"SXID_{code}",
                assessment.status,
                f"SXID {code} ({label}) on {event.device} {bus}: {tally.count} time(s), latest {latest}",
                bus,
                evidence=event.line,
                remedy=assessment.remedy,
            )
        builder.sample(KMSG_RECORDS_LOST, lost)
        builder.sample(KMSG_RECORDS_READ, read)
        builder.sample(KMSG_FOLLOWING, 1.0 if self.following else 0.0)
        return builder.build(self._summary(xids, sxids, lost), worst_action(a for _, a in actions))

    def _cleared(self, tally: _Tally, now: float) -> bool:
        clear = self.cfg.clear_after_s
        return clear is not None and now - tally.last_seen > clear

    def _assess(self, event: XidEvent, entry: CatalogEntry, tally: _Tally, now: float) -> Assessment | None:
        if self._cleared(tally, now):
            return None
        override = self.cfg.overrides.get(str(event.xid))
        base = assess_xid(event, entry, self.cfg.app_level_xids)
        if override is not None:
            return override_status(base, override)
        repeats = sum(1 for t in tally.times if now - t <= self.cfg.repeat_window_s)
        return escalate(base, repeats, self.cfg.repeat_threshold)

    def _summary(
        self, xids: list[tuple[tuple[str, int], _Tally]], sxids: list[tuple[tuple[str, int], _Tally]], lost: int
    ) -> str:
        since = f"in the last {self.cfg.lookback_s:g} s" if self.cfg.lookback_s else "since boot"
        lost_note = f"; {lost} kernel log record(s) lost to overruns" if lost else ""
        if self._nvml_note:
            lost_note += f"; {self._nvml_note}"
        if not xids and not sxids:
            return f"no XID or SXID errors in the kernel log {since}{lost_note}"
        parts = [f"XID {code} on {bus} x{t.count}" for (bus, code), t in xids]
        parts += [f"SXID {code} on {bus} x{t.count}" for (bus, code), t in sxids]
        shown = ", ".join(parts[:6]) + (f", and {len(parts) - 6} more" if len(parts) > 6 else "")
        return f"{shown} ({since}){lost_note}"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"

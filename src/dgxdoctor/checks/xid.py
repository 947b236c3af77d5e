"""NVIDIA XID and NVSwitch SXID errors from the kernel log.

By hand: ``dmesg -T | grep -E 'NVRM: Xid|SXid|fallen off the bus'`` (or ``journalctl -k -g Xid``).

One-shot (``dgxdoctor check``): reads the kernel log buffer since boot (or the last ``lookback_s``).
In the daemon, :meth:`XidCheck.start` (called by the runner before the first run) follows the log until
:meth:`XidCheck.stop`: a daemon thread folds each new record in within a second (see sources/kmsg.py), and
``run()`` only reports the state. When not following, each ``run()`` reads what is new since the previous run.
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

from collections.abc import Callable
from typing import ClassVar, Literal

import structlog
from pydantic import Field, field_validator

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.checks.xid_events import Key, Tally, XidLedger
from dgxdoctor.environment import Environment
from dgxdoctor.judge.xid import (
    DEFAULT_APP_LEVEL_XIDS,
    Assessment,
    XidPolicy,
    assess_sxid,
    assess_tally,
    summary,
    sxid_finding,
    worst_action,
    xid_finding,
)
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder
from dgxdoctor.sources.kmsg import KmsgFollower, KmsgReader, KmsgRecord
from dgxdoctor.sources.nvml_xid import NvmlEventsUnavailable, NvmlXidFollower, PynvmlXidEvents, XidEventSource
from dgxdoctor.sources.xid import SxidEvent, XidCatalog, XidEvent, load_catalog

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
        self.ledger = XidLedger(env.clock, env.monotonic, merge_nvml=settings.nvml_events)
        self.policy = XidPolicy(
            app_level_xids=tuple(settings.app_level_xids),
            repeat_threshold=settings.repeat_threshold,
            repeat_window_s=settings.repeat_window_s,
            clear_after_s=settings.clear_after_s,
            overrides=dict(settings.overrides),
        )
        self._follower: KmsgFollower | None = None
        self._nvml_factory = nvml_events_factory
        self._nvml_follower: NvmlXidFollower | None = None
        self._nvml_note: str | None = None
        self._opened = False

    # --- lifecycle ----------------------------------------------------------------------------------

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
        self._follower = KmsgFollower(self.reader, self.ledger.ingest)
        self._follower.start()

    def _start_nvml(self) -> None:
        try:
            source = self._nvml_factory()
        except NvmlEventsUnavailable as exc:
            self._nvml_note = f"NVML XID events unavailable: {exc}"
            log.warning("nvml_xid_events_unavailable", error=str(exc))
            return
        self._nvml_note = None
        self._nvml_follower = NvmlXidFollower(source, self.ledger.ingest_nvml)
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

    def _open(self) -> None:
        if self._opened:
            return
        self.reader.open()
        if self.cfg.lookback_s is not None:
            self.ledger.min_usec = int((self.env.monotonic() - self.cfg.lookback_s) * 1e6)
        self._opened = True

    def ingest(self, records: list[KmsgRecord]) -> None:
        """Fold kernel log records in (what the follower does; also usable directly)."""
        self.ledger.ingest(records)

    def count(self, pci_bus_id: str, xid: int) -> int:
        return self.ledger.count(pci_bus_id, xid)

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
            self.ledger.ingest(records)
        elif self._follower is not None and self._follower.error:
            raise RuntimeError(self._follower.error)
        if self._nvml_follower is not None and self._nvml_follower.error:
            self._nvml_note = self._nvml_follower.error
        return self._report()

    def _report(self) -> CheckResult:
        b = ResultBuilder(self.name)
        now = self.env.clock()
        xids, sxids = self.ledger.snapshot()
        stats = self.reader.stats
        for code in sorted({code for (_, code), _ in xids}):
            entry = self.catalog.xid(code)
            b.sample(XID_CATALOG_INFO, 1.0, xid=str(code), name=entry.name, resolution=entry.resolution)
        assessments = self._xid_findings(b, xids, now) + self._sxid_findings(b, sxids, now)
        b.sample(KMSG_RECORDS_LOST, stats.lost)
        b.sample(KMSG_RECORDS_READ, stats.records)
        b.sample(KMSG_FOLLOWING, 1.0 if self.following else 0.0)
        since = f"in the last {self.cfg.lookback_s:g} s" if self.cfg.lookback_s else "since boot"
        notes = f"; {stats.lost} kernel log record(s) lost to overruns" if stats.lost else ""
        if self._nvml_note:
            notes += f"; {self._nvml_note}"
        xid_counts = [(bus, code, t.count) for (bus, code), t in xids]
        sxid_counts = [(bus, code, t.count) for (bus, code), t in sxids]
        return b.build(summary(xid_counts, sxid_counts, since, notes), worst_action(assessments))

    def _xid_findings(self, b: ResultBuilder, xids: list[tuple[Key, Tally]], now: float) -> list[Assessment]:
        out = []
        for (bus, code), tally in xids:
            b.sample(XID_ERRORS_TOTAL, tally.count, pci_bus_id=bus, xid=str(code))
            b.sample(XID_LAST_SEEN, tally.last_seen, pci_bus_id=bus, xid=str(code))
            event = tally.last_event
            if not isinstance(event, XidEvent) or self.policy.cleared(tally.last_seen, now):
                continue
            entry = self.catalog.xid(code)
            assessment = assess_tally(event, entry, tally.times, now, self.policy)
            out.append(assessment)
            b.findings.append(xid_finding(event, entry.name, tally.count, now - tally.last_seen, assessment))
        return out

    def _sxid_findings(self, b: ResultBuilder, sxids: list[tuple[Key, Tally]], now: float) -> list[Assessment]:
        out = []
        for (bus, code), tally in sxids:
            b.sample(SXID_ERRORS_TOTAL, tally.count, pci_bus_id=bus, sxid=str(code))
            b.sample(SXID_LAST_SEEN, tally.last_seen, pci_bus_id=bus, sxid=str(code))
            event = tally.last_event
            if not isinstance(event, SxidEvent) or self.policy.cleared(tally.last_seen, now):
                continue
            entry = self.catalog.sxid(code)
            assessment = assess_sxid(event, entry)
            out.append(assessment)
            b.findings.append(sxid_finding(event, entry, tally.count, now - tally.last_seen, assessment))
        return out

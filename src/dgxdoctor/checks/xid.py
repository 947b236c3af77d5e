"""NVIDIA XID and NVSwitch SXID errors from the kernel log.

By hand: ``dmesg -T | grep -E 'NVRM: Xid|SXid|fallen off the bus'`` (or ``journalctl -k -g Xid``).

One-shot (``dgxdoctor check``): reads the kernel log buffer since boot (or the last ``lookback_s``).
In the daemon, :meth:`XidCheck.start` (called by the runner before the first run) follows the log until
:meth:`XidCheck.stop`: a daemon thread folds each new record in within milliseconds (see sources/kmsg.py) and,
when it counted an XID or SXID, asks the daemon to run the check at once (``env.fleet.wake``), so /metrics and
/state show it without waiting for the interval; ``run()`` only reports the state. When not following, each
``run()`` reads what is new since the previous run.
In the daemon, counts are per boot and survive a restart of the daemon (checks/xid_memory.py: what is kept, and
how the window and the records lost are stated truthfully).

Severity comes from the catalog's resolution (data/xid_catalog.json, NVIDIA's Xid catalog): reset,
reboot or support is CRITICAL, restart-the-application is WARNING, IGNORE is OK. Application-level XIDs
(13, 31, 43, 45 by default) are WARNING whatever the catalog says. The same XID on the same GPU
``repeat_threshold`` times within ``repeat_window_s`` escalates a WARNING to CRITICAL (IGNORE-class
XIDs stay OK).
``overrides`` sets a status per XID outright.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, ClassVar, Literal

from msgspec import Meta, field

from dgxdoctor import eventlog
from dgxdoctor.checks import xid_memory
from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.checks.kernel_events import KERNEL_EVENTS_TOTAL, KernelEventLedger
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
from dgxdoctor.settings.bounds import DAY_S, WEEK_S, YEAR_S
from dgxdoctor.sources.device_map import read_device_map
from dgxdoctor.sources.kmsg import KmsgFollower, KmsgReader, KmsgRecord
from dgxdoctor.sources.nvml_xid import NvmlEventsUnavailable, NvmlXidFollower, PynvmlXidEvents, XidEventSource
from dgxdoctor.sources.procfs import trusted_uids
from dgxdoctor.sources.statefile import boot_id
from dgxdoctor.sources.xid import SxidEvent, XidCatalog, XidEvent, load_catalog

XID_ERRORS_TOTAL = MetricSpec(
    "dgxdoctor_xid_errors_total",
    "NVIDIA XID errors seen in the kernel log per GPU and XID code, this boot (the daemon keeps them across its "
    "restarts; a 'fallen off the bus' line without an Xid line counts as XID 79)",
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
    "NVSwitch SXID errors seen in the kernel log per switch and SXID code, this boot (kept across restarts of "
    "the daemon)",
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
    "Kernel log records of this boot that left the ring buffer before dgxdoctor read them: gone before its first "
    "read, overrun between reads, or while it was down",
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

# The kernel faults beyond XIDs are counted by this check too (checks/kernel_events.py).
METRICS_ALSO = (KERNEL_EVENTS_TOTAL,)

log = eventlog.get_logger(__name__)


class XidSettings(CheckSettings, frozen=True):
    interval_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="daemon: seconds between reports (events are followed, not polled)")
    ] = 10.0
    lookback_s: Annotated[
        Annotated[float, Meta(gt=0, le=YEAR_S)] | None,
        Meta(description="only kernel log records newer than this many seconds; unset: the whole buffer since boot"),
    ] = None
    app_level_xids: Annotated[
        list[Annotated[int, Meta(ge=1, le=999)]],
        Meta(description="XIDs caused by the application, WARNING unless repeated (NVIDIA: 13, 31, 43, 45)"),
    ] = field(default_factory=lambda: list(DEFAULT_APP_LEVEL_XIDS))
    repeat_threshold: Annotated[
        int,
        Meta(
            ge=2,
            le=1000,
            description="this many of the same XID on the same GPU within repeat_window_s "
            "escalates a warning to critical",
        ),
    ] = 3
    repeat_window_s: Annotated[float, Meta(gt=0, le=WEEK_S, description="window in seconds for repeat_threshold")] = (
        3600.0
    )
    clear_after_s: Annotated[
        Annotated[float, Meta(gt=0, le=YEAR_S)] | None,
        Meta(description="events older than this no longer set the status (they stay counted); unset: until reboot"),
    ] = None
    nvml_events: Annotated[
        bool,
        Meta(
            description="daemon: also follow NVML's XID events (the kernel log stays primary; "
            "an event both report is counted once)"
        ),
    ] = False
    overrides: Annotated[
        dict[str, Literal["ok", "warning", "critical"]],
        Meta(description='status per XID code, overriding the catalog, e.g. {"13" = "critical", "63" = "ok"}'),
    ] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [k for k in self.overrides if not (k.isascii() and k.isdigit() and len(k) <= 3 and 0 < int(k) < 1000)]
        if bad:
            keys = ", ".join(repr(k) for k in bad)
            raise ValueError(f"overrides: keys must be XID numbers 1..999 as strings, got {keys}")


class XidCheck(Check[XidSettings]):
    name: ClassVar[str] = "xid"

    def __init__(
        self,
        settings: CheckSettings,
        env: Environment,
        catalog: XidCatalog | None = None,
        nvml_events_factory: Callable[[], XidEventSource] = PynvmlXidEvents,
    ) -> None:
        super().__init__(settings, env)
        self.catalog = catalog or load_catalog()
        self.reader = KmsgReader(env.kmsg_path)
        self.ledger = XidLedger(env.clock, env.monotonic, merge_nvml=self.settings.nvml_events)
        # Faults beyond XIDs from the same records (checks/kernel_events.py), named after this node's devices.
        self.kernel = KernelEventLedger(env.clock, env.monotonic)
        self.policy = XidPolicy(
            app_level_xids=tuple(self.settings.app_level_xids),
            repeat_threshold=self.settings.repeat_threshold,
            repeat_window_s=self.settings.repeat_window_s,
            clear_after_s=self.settings.clear_after_s,
            overrides=dict(self.settings.overrides),
        )
        self._follower: KmsgFollower | None = None
        self._nvml_factory = nvml_events_factory
        self._nvml_follower: NvmlXidFollower | None = None
        self._nvml_note: str | None = None
        self._opened = False
        # The daemon remembers its tallies across restarts (checks/xid_memory.py); a look-back window does not.
        self._persist = not env.one_shot and self.settings.lookback_s is None
        self._statefile = xid_memory.state_file(env.state_dir)
        self._memory: xid_memory.Memory | None = None
        self._saved: tuple[int, int | None, int] | None = None

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
        if self.settings.nvml_events and self._nvml_follower is None:
            self._start_nvml()
        self._open()
        self._follower = KmsgFollower(self.reader, self._followed)
        self._follower.start()

    def _start_nvml(self) -> None:
        try:
            source = self._nvml_factory()
        except NvmlEventsUnavailable as exc:
            self._nvml_note = f"NVML XID events unavailable: {exc}"
            log.warning("nvml_xid_events_unavailable", error=str(exc))
            return
        self._nvml_note = None
        self._nvml_follower = NvmlXidFollower(source, self._followed_nvml)
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
        if self._persist:
            self._restore()
        if self.settings.lookback_s is not None:
            self.ledger.min_usec = int((self.env.monotonic() - self.settings.lookback_s) * 1e6)
            self.kernel.min_usec = self.ledger.min_usec
        self.kernel.devices = read_device_map(self.env.sysfs_root)
        self._opened = True

    def ingest(self, records: list[KmsgRecord]) -> None:
        """Fold kernel log records in (what the follower does; also usable directly)."""
        self.ledger.ingest(records)
        self.kernel.ingest(records)

    def count(self, pci_bus_id: str, xid: int) -> int:
        return self.ledger.count(pci_bus_id, xid)

    def _followed(self, records: list[KmsgRecord]) -> None:
        counted = self.ledger.ingest(records)
        if self.kernel.ingest(records) or counted:
            self._wake()

    def _followed_nvml(self, events: list[tuple[str, int]]) -> None:
        if self.ledger.ingest_nvml(events):
            self._wake()

    def _wake(self) -> None:
        """A follower counted something: ask the daemon to run this check now, so /metrics and /state show it."""
        fleet = self.env.fleet
        if fleet is None:
            return
        try:
            fleet.wake(self.name)
        except Exception as exc:  # the follower must keep reading whatever the daemon's side does
            log.warning("xid_wake_failed", error=f"{type(exc).__name__}: {exc}")

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
        result = self._report()
        if self._persist:
            self._remember()
        return result

    # --- the memory across restarts, the window -----------------------------------------------------

    def _restore(self) -> None:
        """Take up this boot's memory, if any: tallies, and reading resumes after the last record counted."""
        boot = boot_id(self.env.proc_root)
        memory = xid_memory.load(self._statefile, boot)
        if memory is None:
            self._memory = xid_memory.Memory(boot_id=boot)
            return
        self.ledger.restore(memory.xids, memory.sxids)
        self.kernel.restore(memory.kernel)
        if memory.last_seq is not None and self.reader.is_device:
            self.reader.resume_after(memory.last_seq)
        self._memory = memory
        self._saved = (self.ledger.counted + self.ledger.restored + self.kernel.counted, memory.last_seq, memory.lost)
        log.info("xid_memory_restored", xids=len(memory.xids), sxids=len(memory.sxids), last_seq=memory.last_seq)

    def _window(self) -> tuple[bool, float | None, int]:
        """(from boot?, the window's first record's time, records of this boot lost before or between reads)."""
        stats = self.reader.stats
        memory = self._memory
        if memory is not None and memory.last_seq is not None:
            return memory.from_boot, memory.window_start, memory.lost + stats.lost
        if not self.reader.is_device or stats.first_seq is None:
            # A text log is what it is; a device not read yet says nothing either way.
            return True, None, stats.lost
        before = stats.first_seq  # records 0 .. first_seq-1 of this boot left the buffer unread
        return before == 0, self.ledger.first_wall, before + stats.lost

    def _since(self, from_boot: bool, start: float | None) -> str:
        if self.settings.lookback_s:
            return f"in the last {self.settings.lookback_s:g} s"
        if from_boot:
            return "since boot"
        if start is None:
            return "since dgxdoctor started reading (the ring buffer no longer held the boot)"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
        return f"since {when} (the ring buffer no longer held the boot)"

    def _remember(self) -> None:
        """Save this boot's memory when something changed since the last save."""
        memory = self._memory
        last_seq = self.reader.last_seq
        if memory is None or last_seq is None:
            return
        from_boot, start, lost = self._window()
        marker = (self.ledger.counted + self.ledger.restored + self.kernel.counted, last_seq, lost)
        if marker == self._saved:
            return
        xids, sxids = self.ledger.snapshot()
        new = xid_memory.Memory(
            memory.boot_id, last_seq, from_boot, start, lost, dict(xids), dict(sxids), self.kernel.to_docs()
        )
        if xid_memory.save(self._statefile, new):
            self._saved = marker

    def _report(self) -> CheckResult:
        b = ResultBuilder(self.name)
        now = self.env.clock()
        xids, sxids = self.ledger.snapshot()
        stats = self.reader.stats
        for code in sorted({code for (_, code), _ in xids}):
            entry = self.catalog.xid(code)
            b.sample(XID_CATALOG_INFO, 1.0, xid=str(code), name=entry.name, resolution=entry.resolution)
        assessments = self._xid_findings(b, xids, now) + self._sxid_findings(b, sxids, now)
        owners = trusted_uids(serving_uid=self.env.serving_uid)  # an OOM-killed "vllm" of nobody serves nothing
        kernel_words = self.kernel.report(b, now, lambda last: self.policy.cleared(last, now), owners)
        from_boot, start, lost = self._window()
        b.sample(KMSG_RECORDS_LOST, lost)
        b.sample(KMSG_RECORDS_READ, stats.records)
        b.sample(KMSG_FOLLOWING, 1.0 if self.following else 0.0)
        since = self._since(from_boot, start)
        notes = f"; {lost} kernel log record(s) of this boot lost (left the ring buffer unread)" if lost else ""
        if self._nvml_note:
            notes += f"; {self._nvml_note}"
        if kernel_words:
            notes += (
                "; kernel: "
                + ", ".join(kernel_words[:4])
                + (f" +{len(kernel_words) - 4} more" if len(kernel_words) > 4 else "")
            )
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
            b.add(xid_finding(event, entry.name, tally.count, now - tally.last_seen, assessment))
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
            b.add(sxid_finding(event, entry, tally.count, now - tally.last_seen, assessment))
        return out

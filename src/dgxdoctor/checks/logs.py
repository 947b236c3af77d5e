"""`logs`: new lines of the vLLM and Ray logs matched against the catalog of known failure signatures.

By hand: ``grep -E 'NCCL WARN|Watchdog caught|connectFullMesh|CUDA out of memory|placement group'
/tmp/ray/session_latest/logs/*.err /var/log/vllm.log``.

The daemon follows each file: offsets live in ``<state_dir>/logs_offsets.json`` (see ``sources.logtail`` for
rotation and truncation). A match stays in the result for ``hold_s`` after it was last seen, then the check returns
to OK by itself; matches inside that window are kept in the same file, so a restart or a one-shot ``dgxdoctor
check`` still reports them. The one-shot ``check`` reads the recent past of each file instead (the last
``check_window_bytes`` of files written in the last ``check_window_s``), saves nothing, and says what it did not
read. A backlog over ``max_bytes_per_run`` is a WARNING naming the unread bytes in both.

The journal of the units in ``journal_units`` (by default those the shipped units in systemd/ name: vLLM, Ray's
head and worker, vLLM's mp head and headless worker) is read too, through ``journalctl --output=json``
(``sources.journal``): the daemon from a cursor kept in memory and saved with the offsets (a restart goes on from
it), the first read (and the one-shot ``check``'s) from the start of the same ``check_window_s``, at most
``journal_max_lines`` entries and ``max_bytes_per_run`` of output per run. Its lines go to the same scanner as the
files', one per unit (subject ``journal:<unit>``). journalctl missing or failing is UNKNOWN
(``JOURNAL_UNREADABLE``), never OK; a unit with no entries is fine. By hand:
``journalctl -u vllm.service --since=-15min``.

With ``[node] container`` set (vLLM in a container, docs/container.md) the container's log is read too, through
the runtime (``docker logs --since=... --timestamps``, ``sources.container``): its stdout and stderr in the order
written, from the time of the last line read (kept and saved like the journal's cursor), the first read from the
start of ``check_window_s``, at most ``journal_max_lines`` lines and ``max_bytes_per_run`` of output per run (the
newest, when there are more: a WARNING). Its lines go to the same scanner, as vLLM's (subject
``container:<name>``). A log that cannot be read is UNKNOWN (``CONTAINER_LOG_UNREADABLE``), never OK.

Only records that no client controls count here (``judge.records``, ``judge.scan``: never a request-log or
access-log record, nor a record of the server's request handling): these findings and
``dgxdoctor_logs_signature_matches_total`` lead to actions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, ClassVar

from msgspec import Meta, Struct, field
from msgspec.structs import replace

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.log_files import (
    container_log_backlog,
    container_log_unreadable,
    journal_backlog,
    journal_unreadable,
    log_backlog,
    log_unreadable,
)
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Sample, Status
from dgxdoctor.settings.bounds import DAY_S, WEEK_S
from dgxdoctor.sources.container import ContainerLogFollower, LogRead
from dgxdoctor.sources.journal import CURSOR_RE, JournalFollower, JournalRead
from dgxdoctor.sources.logtail import LogFollower, expand_paths, read_recent
from dgxdoctor.sources.statefile import StateFile
from dgxdoctor.sources.systemd import UNIT_NAME_RE
from dgxdoctor.validation import ByteCount

if TYPE_CHECKING:  # the matching code is imported with the catalog, at the first line to match
    from dgxdoctor.judge.scan import Scanner
    from dgxdoctor.judge.signatures import Catalog, Signature

MATCHES_TOTAL = MetricSpec(
    "dgxdoctor_logs_signature_matches_total",
    "Log lines matching a known failure signature since the agent started, by signature code; every code of the "
    "catalog at 0 from the check's start.",
    "counter",
    ("code",),
)
UNCATALOGUED_TOTAL = MetricSpec(
    "dgxdoctor_logs_uncatalogued_errors_total",
    "Log lines that are plainly failures but that no signature of the catalog names (an exception line, CUDA error:, "
    "an ERROR or CRITICAL record: judge/uncatalogued.py) since the agent started, by source (a file, journal:<unit>, "
    "container:<name>); shown, never acted on: serving logs carry ERROR lines all day.",
    "counter",
    ("source",),
)
# The latest uncatalogued lines shown per source.
UNCATALOGUED_SHOWN = 3
FILES_FOLLOWED = MetricSpec(
    "dgxdoctor_logs_files_followed",
    "Log files the logs check followed in its last run.",
)
EVIDENCE_MAX = 500
# logs_offsets.json's format: 1 is 0.1.0's (positions, recent) with its version and the journal's cursor (absent:
# none yet); that release wrote it without a version (0).
STATE_VERSION = 1
# The units of systemd/ that log vLLM's and Ray's lines (tests/unit/test_journal_source.py holds this list to the
# directory): vllm.service (Ray executor), the mp executor's head and headless worker, Ray's head and worker.
SHIPPED_UNITS = (
    "vllm.service",
    "vllm-head-mp.service",
    "vllm-worker-mp.service",
    "ray-head.service",
    "ray-worker.service",
)
JOURNAL_PREFIX = "journal:"
CONTAINER_PREFIX = "container:"


def journal_key(unit: str) -> str:
    """The subject of a unit's matches, and its scanner's key beside the files' paths."""
    return JOURNAL_PREFIX + unit


def container_key(name: str) -> str:
    """The subject of the matches in a container's log (``[node] container``)."""
    return CONTAINER_PREFIX + name


def journal_kind(unit: str) -> str:
    """Which catalog kinds a unit's lines are read with: Ray's units as Ray's logs, the others as vLLM's."""
    return "ray" if unit.startswith("ray") else "vllm"


class LogBytes(ByteCount):
    """Log bytes read in one run: 1 B .. 4 GiB."""

    low = 1
    high = 4 << 30


class LogsSettings(CheckSettings, frozen=True):
    """The logs check: vLLM and Ray log files followed for known failure signatures."""

    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 10.0
    vllm_paths: Annotated[
        list[str], Meta(description="vLLM log files or globs (e.g. /var/log/vllm/vllm.log); empty: none")
    ] = field(default_factory=list)
    ray_paths: Annotated[list[str], Meta(description="Ray log files or globs")] = field(
        default_factory=lambda: [
            "/tmp/ray/session_latest/logs/*.log",
            "/tmp/ray/session_latest/logs/*.err",
            "/tmp/ray/session_latest/logs/*.out",
        ]
    )
    max_bytes_per_run: Annotated[
        LogBytes,
        Meta(
            description="read at most this many new bytes per run over all files (or a size: 32M), and as much of "
            "journalctl's output; rest next run"
        ),
    ] = LogBytes(32 * 1024 * 1024)
    from_start: Annotated[
        bool,
        Meta(
            description="read files present when the agent starts from their start (default: from their end, so a "
            "restart does not report old lines; files appearing later are always read whole)"
        ),
    ] = False
    hold_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="keep reporting a match this many seconds after it was last seen")
    ] = 900.0
    check_window_bytes: Annotated[
        LogBytes,
        Meta(
            description="one-shot `dgxdoctor check`: read the last this many bytes (or a size: 8M) of each log file "
            "(the recent past; the daemon follows files from their end instead)"
        ),
    ] = LogBytes(8 * 1024 * 1024)
    check_window_s: Annotated[
        float,
        Meta(
            description="one-shot `dgxdoctor check`: a log file not written for this many seconds is not read; the "
            "journal is read from this many seconds ago (the daemon's first read too)",
            gt=0,
            le=WEEK_S,
        ),
    ] = 900.0
    journal_units: Annotated[
        list[str],
        Meta(
            max_length=64,
            description="systemd units whose journal is followed (journalctl -u), as vLLM's and Ray's lines; "
            "empty: none. Default: the units of the shipped systemd/ files",
        ),
    ] = field(default_factory=lambda: list(SHIPPED_UNITS))
    journal_directory: Annotated[
        str | None,
        Meta(
            description="read the journal files in this directory (journalctl --directory) instead of the system "
            "journal: a container's, a copied one; unset: the system journal"
        ),
    ] = None
    journal_max_lines: Annotated[
        int, Meta(ge=1, le=10_000_000, description="read at most this many journal entries per run; rest next run")
    ] = 20000

    def __post_init__(self) -> None:
        for unit in self.journal_units:
            if not UNIT_NAME_RE.match(unit):
                raise ValueError(f"journal_units: not a systemd unit name (letters, digits, ':-_.\\@'): {unit[:80]!r}")


class _Recent(Struct):
    signature: Signature
    path: str
    line: str
    last_seen: float
    count: int


class _Unknown(Struct):
    """The plain failures no signature names, of one source, inside the window: counted and shown."""

    count: int
    latest: list[str]
    last_seen: float


class LogsCheck(Check[LogsSettings]):
    name: ClassVar[str] = "logs"

    def __init__(self, settings: CheckSettings, env: Environment, catalog: Catalog | None = None) -> None:
        super().__init__(settings, env)
        self._catalog = catalog
        self.state = StateFile(env.state_dir / "logs_offsets.json", version=STATE_VERSION)
        self._follower: LogFollower | None = None
        self._recent: dict[tuple[str, str], _Recent] = {}
        self._totals: dict[str, int] = {}
        self._unknown: dict[str, _Unknown] = {}
        self._unknown_totals: dict[str, int] = {}
        # One scanner per file: it keeps the last lines, so a match is read in its context (judge.context).
        self._scanners: dict[str, Scanner] = {}
        self._journal: JournalFollower | None = None
        self._container: ContainerLogFollower | None = None

    @property
    def catalog(self) -> Catalog:
        """Compiled at the first line to match (or held match to restore): on a node with no log files yet the
        daemon never holds it (its patterns and RE2's prefilter: ~4.9 MiB resident, benchmarks/README.md)."""
        if self._catalog is None:
            from dgxdoctor.judge.signatures import load_catalog

            self._catalog = load_catalog()
        return self._catalog

    def zero_samples(self) -> tuple[Sample, ...]:
        """``dgxdoctor_logs_signature_matches_total`` at 0 for every code of the catalog (30 series), so that the
        first NCCL timeout is an increase from 0 (``DgxdoctorNcclFailure``), not a series born at 1."""
        from dgxdoctor.judge.signatures import signature_codes

        return tuple(Sample(MATCHES_TOTAL, 0.0, {"code": code}) for code in signature_codes())

    def _load_follower(self) -> LogFollower:
        if self._follower is None:
            saved = self.state.load()
            positions = saved.get("positions", {})
            self._follower = LogFollower(
                positions if isinstance(positions, dict) else {}, from_start=self.settings.from_start
            )
            self._recent = self._restore_recent(saved.get("recent"))
            cursor = saved.get("journal_cursor")
            if isinstance(cursor, str) and CURSOR_RE.match(cursor):
                self._journal_follower().cursor = cursor
            after = saved.get("container_after_ns")
            follower = self._container_follower()
            if follower is not None and isinstance(after, int) and saved.get("container") == follower.container.name:
                follower.after_ns = after
        return self._follower

    def _restore_recent(self, raw: object) -> dict[tuple[str, str], _Recent]:
        """Matches still inside the window survive a restart (and one-shot `dgxdoctor check` runs)."""
        if not raw:
            return {}
        signatures = self.catalog.by_code()
        recent: dict[tuple[str, str], _Recent] = {}
        for item in raw if isinstance(raw, list) else []:
            if not isinstance(item, dict):
                continue
            sig = signatures.get(str(item.get("code")))
            path, line, last_seen, count = item.get("path"), item.get("line"), item.get("last_seen"), item.get("count")
            if sig is None or not isinstance(path, str) or not isinstance(line, str):
                continue
            if not isinstance(last_seen, int | float) or not isinstance(count, int) or count < 1:
                continue
            recent[(sig.code, path)] = _Recent(sig, path, line, float(last_seen), count)
        return recent

    def _save(self, follower: LogFollower) -> None:
        recent = [
            {
                "code": r.signature.code,
                "path": r.path,
                "line": r.line[:EVIDENCE_MAX],
                "last_seen": r.last_seen,
                "count": r.count,
            }
            for r in self._recent.values()
        ]
        cursor = self._journal.cursor if self._journal is not None else None
        box = self._container
        doc: dict[str, object] = {"positions": follower.state(), "recent": recent, "journal_cursor": cursor}
        if box is not None:
            doc |= {"container": box.container.name, "container_after_ns": box.after_ns}
        self.state.save(doc)  # a failure is logged and counted

    def _match(self, lines: Iterable[tuple[str, str]], kinds: Mapping[str, str], now: float) -> None:
        """Count the signatures the new lines show, each read in its record and with the lines before it.

        Only records that no client controls count (``judge.records``): this result leads to actions."""
        for gone in [p for p in self._scanners if p not in kinds and p.removesuffix(".1") not in kinds]:
            del self._scanners[gone]
        by_path: dict[str, list[str]] = {}
        for path, line in lines:
            by_path.setdefault(path, []).append(line)
        for path, new in by_path.items():
            scanner = self._scanners.get(path)
            if scanner is None:
                kind = kinds.get(path) or kinds.get(path.removesuffix(".1"))
                from dgxdoctor.judge.scan import Scanner

                scanner = self._scanners[path] = Scanner(self.catalog, kind, trusted_only=True)
            before = scanner.lines_read
            matched: set[int] = set()
            for match in [*scanner.feed("\n".join(new)), *scanner.flush()]:
                matched.add(match.number - 1 - before)
                if not match.trusted:
                    continue
                sig = match.signature
                self._totals[sig.code] = self._totals.get(sig.code, 0) + 1
                key = (sig.code, path)
                seen = self._recent.get(key)
                self._recent[key] = _Recent(sig, path, match.line, now, seen.count + 1 if seen else 1)
            self._count_unknown(path, new, matched, now)

    def _count_unknown(self, path: str, lines: list[str], matched: set[int], now: float) -> None:
        """The plain failures of ``lines`` that no signature named, as ``diagnose`` reads them: counted per source,
        the latest shown."""
        from dgxdoctor.judge.uncatalogued import uncatalogued

        found = uncatalogued(lines, matched, lambda line: bool(self.catalog.find(line)))
        if not found:
            return
        lines_counted = sum(u.times for u in found)
        self._unknown_totals[path] = self._unknown_totals.get(path, 0) + lines_counted
        held = self._unknown.get(path) or _Unknown(0, [], now)
        latest = [*held.latest, *(u.line[:EVIDENCE_MAX] for u in found)][-UNCATALOGUED_SHOWN:]
        self._unknown[path] = _Unknown(held.count + lines_counted, latest, now)

    def run(self) -> CheckResult:
        s = self.settings
        files = {path: "ray" for path in expand_paths(s.ray_paths)}
        files.update({path: "vllm" for path in expand_paths(s.vllm_paths)})
        kinds = {**files, **{journal_key(u): journal_kind(u) for u in s.journal_units}}
        if self.env.container is not None:
            kinds[container_key(self.env.container.name)] = "vllm"
        if self.env.one_shot:
            return self._run_recent(files, kinds)
        follower = self._load_follower()
        if not kinds:
            # Still a poll: files that appear from now on (Ray started after the agent) are new, read from 0.
            follower.poll([], 0)
            return CheckResult.skipped(self.name, "no vLLM or Ray log files or journal units configured or present")
        polled = follower.poll(sorted(files), s.max_bytes_per_run)
        journal = self._journal_follower().poll(self._window_start_us()) if s.journal_units else None
        box = self._container_follower()
        boxed = box.poll(self._window_start_us() * 1000) if box is not None else None

        now = self.env.clock()
        self._match([*polled.lines, *_journal_lines(journal, s.journal_units), *self._boxed_lines(boxed)], kinds, now)
        for key in [k for k, r in self._recent.items() if now - r.last_seen > s.hold_s]:
            del self._recent[key]
        for source in [k for k, u in self._unknown.items() if now - u.last_seen > s.hold_s]:
            del self._unknown[source]
        self._save(follower)

        b = self._findings(polled.errors)
        b.sample(FILES_FOLLOWED, len(polled.files))
        if polled.budget_exhausted:
            unread = _unread_bytes(follower, polled.files)
            b.add(log_backlog(unread, s.max_bytes_per_run, one_shot=False))
        self._journal_findings(b, journal, one_shot=False)
        self._container_findings(b, boxed, one_shot=False)
        return b.build(self._summary(f"in {len(polled.files)} log file(s){self._journal_said()}"))

    def _journal_follower(self) -> JournalFollower:
        if self._journal is None:
            s = self.settings
            self._journal = JournalFollower(
                self.env.run_command_head, s.journal_units, s.journal_directory, s.journal_max_lines,
                s.max_bytes_per_run,
            )  # fmt: skip
        return self._journal

    def _container_follower(self) -> ContainerLogFollower | None:
        """The log of ``[node] container`` (None when vLLM runs on the host)."""
        if self._container is None and self.env.container is not None:
            s = self.settings
            self._container = ContainerLogFollower(
                self.env.run_command_merged, self.env.container, s.journal_max_lines, s.max_bytes_per_run
            )
        return self._container

    def _boxed_lines(self, read: LogRead | str | None) -> list[tuple[str, str]]:
        if not isinstance(read, LogRead) or self._container is None:
            return []
        key = container_key(self._container.container.name)
        return [(key, line.text) for line in read.lines]

    def _container_findings(self, b: ResultBuilder, read: LogRead | str | None, *, one_shot: bool) -> None:
        if self._container is None:
            return
        name = self._container.container.name
        if isinstance(read, str):
            b.add(container_log_unreadable(name, read))
        elif read is not None and read.more:
            b.add(container_log_backlog(name, self.settings.journal_max_lines, one_shot=one_shot))

    def _window_start_us(self) -> int:
        """The journal's first read starts where the files' window does (journal time is wall-clock time)."""
        return int((time.time() - self.settings.check_window_s) * 1e6)

    def _journal_findings(self, b: ResultBuilder, read: JournalRead | str | None, *, one_shot: bool) -> None:
        s = self.settings
        if isinstance(read, str):
            b.add(journal_unreadable(list(s.journal_units), read))
        elif read is not None and read.more:
            b.add(journal_backlog(s.journal_max_lines, s.max_bytes_per_run, one_shot=one_shot))

    def _journal_said(self) -> str:
        n = len(self.settings.journal_units)
        said = f" and the journal of {n} unit(s)" if n else ""
        if self.env.container is not None:
            said += f" and the log of container {self.env.container.name}"
        return said

    def _findings(self, errors: Iterable[str]) -> ResultBuilder:
        """The matches held (worst first), the match counters, the files that could not be read."""
        b = ResultBuilder(self.name)
        for recent in sorted(self._recent.values(), key=lambda r: (-r.signature.severity.rank, r.path)):
            found = recent.signature.finding(recent.path, recent.line[:EVIDENCE_MAX], recent.count)
            b.add(replace(found, seen_at=recent.last_seen))  # held lines are as old as their last match
        for code in sorted(self._totals):
            b.sample(MATCHES_TOTAL, self._totals[code], code=code)
        for source, unknown in sorted(self._unknown.items()):
            shown = "; ".join(line[:EVIDENCE_MAX] for line in unknown.latest)
            b.add(
                Finding(
                    "LOGS_UNCATALOGUED_ERRORS",
                    Status.OK,
                    f"{unknown.count} line(s) in the last {self.settings.hold_s:g} s look like failures no signature "
                    f"names (shown, not acted on); latest: {shown}",
                    source,
                    evidence=unknown.latest[-1][:EVIDENCE_MAX],
                )
            )
        for source in sorted(self._unknown_totals):
            b.sample(UNCATALOGUED_TOTAL, self._unknown_totals[source], source=source)
        for error in errors:
            b.add(log_unreadable(error))
        return b

    def _summary(self, what: str) -> str:
        codes = sorted({r.signature.code for r in self._recent.values()})
        if codes:
            return f"{len(codes)} failure signature(s) in the last {self.settings.hold_s:g} s: {', '.join(codes)}"
        return f"no known failure signature {what}"

    def _run_recent(self, files: Mapping[str, str], kinds: Mapping[str, str]) -> CheckResult:
        """One-shot `dgxdoctor check`: the recent past of each file (``check_window_bytes`` of the files written
        in the last ``check_window_s``) and of the journal (its newest entries of that window), with the daemon's
        held matches; what was not read is said, a backlog over the per-run limit is a WARNING. Nothing is saved:
        the daemon's positions stay as they are."""
        s = self.settings
        self._recent = self._restore_recent(self.state.load().get("recent"))
        if not kinds:
            return CheckResult.skipped(self.name, "no vLLM or Ray log files or journal units configured or present")
        now = self.env.clock()
        read = read_recent(sorted(files), s.check_window_bytes, s.max_bytes_per_run, s.check_window_s, time.time())
        journal = self._journal_follower().recent(self._window_start_us()) if s.journal_units else None
        box = self._container_follower()
        boxed = box.recent(self._window_start_us() * 1000) if box is not None else None
        self._match([*read.lines, *_journal_lines(journal, s.journal_units), *self._boxed_lines(boxed)], kinds, now)
        for key in [k for k, r in self._recent.items() if now - r.last_seen > s.hold_s]:
            del self._recent[key]
        b = self._findings(read.errors)
        b.sample(FILES_FOLLOWED, len(read.files))
        if read.unread_bytes:
            b.add(log_backlog(read.unread_bytes, s.max_bytes_per_run, one_shot=True))
        self._journal_findings(b, journal, one_shot=True)
        self._container_findings(b, boxed, one_shot=True)
        parts = [f"read the last {_mib(read.bytes_read)} of {len(read.files)} log file(s)"]
        if read.stale:
            parts.append(f"{len(read.stale)} file(s) not written in the last {s.check_window_s:g} s not read")
        if read.older_bytes:
            parts.append(f"{_mib(read.older_bytes)} before the last {_mib(s.check_window_bytes)} per file not read")
        if isinstance(journal, JournalRead):
            parts.append(f"{len(journal.entries)} journal entries of the last {s.check_window_s:g} s")
        if isinstance(boxed, LogRead) and self.env.container is not None:
            parts.append(f"{len(boxed.lines)} lines of container {self.env.container.name}'s log")
        return b.build(self._summary("in the recent past") + "; " + ", ".join(parts))


def _journal_lines(read: JournalRead | str | None, units: list[str]) -> list[tuple[str, str]]:
    """The entries read, as (subject, line) beside the files' lines: each under the unit it is of."""
    if not isinstance(read, JournalRead):
        return []
    return [(journal_key(e.unit if e.unit in units else units[0]), e.message) for e in read.entries]


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _unread_bytes(follower: LogFollower, files: Iterable[str]) -> int:
    """Bytes of the followed files after the positions the follower reached."""
    total = 0
    for path in files:
        pos = follower.positions.get(path)
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        total += max(0, size - pos.offset) if pos is not None else 0
    return total

"""The systemd journal of a few units, read through ``journalctl --output=json`` (argv only, never a shell).

By hand: ``journalctl --unit=vllm.service --since=-15min --output=json --no-pager``. One entry per line::

    {"__CURSOR":"s=5144...;i=3;b=0000...;m=0;t=661df1da33093;x=b2ba...","__REALTIME_TIMESTAMP":"1796460763099283",
     "_SYSTEMD_UNIT":"vllm.service","MESSAGE":"ERROR 12-05 08:52:43 [core.py:1007] EngineDeadError: ..."}

``MESSAGE`` is a string, or an array of byte values when it is not valid UTF-8 (journalctl(1), "json"), or null.
The entries of several units come interleaved in time order, each with a cursor: the next read starts
``--after-cursor`` the last one consumed, so nothing is read twice and nothing is skipped. What is read is bounded
twice: ``--lines`` (journalctl stops after that many entries) and the characters of output kept (the program is
stopped past them; the entry cut there is read next time). ``--directory`` points at journal files elsewhere (a
container's, a test's: ``systemd-journal-remote`` writes them from export-format input).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout, HeadCommandRunner
from dgxdoctor.sources.systemd import UNIT_NAME_RE

JOURNALCTL = "journalctl"
JOURNALCTL_TIMEOUT_S = 10.0
# The fields asked for (journalctl always adds __CURSOR and the timestamps): the line, and which unit it is of.
# A line systemd itself writes about a unit ("vllm.service: Main process exited, code=killed") carries UNIT=,
# a core dump's COREDUMP_UNIT=, journald's own lines about it OBJECT_SYSTEMD_UNIT=.
OUTPUT_FIELDS = "MESSAGE,_SYSTEMD_UNIT,UNIT,OBJECT_SYSTEMD_UNIT,COREDUMP_UNIT,_PID"
UNIT_FIELDS = ("_SYSTEMD_UNIT", "UNIT", "OBJECT_SYSTEMD_UNIT", "COREDUMP_UNIT")
# s=51441b2e3a3b4b9eb18d1cda8cec1cde;i=3;b=00000000000000000000000000000000;m=0;t=661df1da33093;x=b2ba109173c80ac2
# The output kept is never less than this, so one entry always fits and the cursor moves on: journald cuts a line at
# LineMax= (48K by default), and JSON escaping makes a character at most six.
MIN_CHARS = 2**20
CURSOR_RE = lazy_compile(r"^[A-Za-z0-9=;_-]{1,512}$")


class JournalEntry(Struct, frozen=True):
    cursor: str
    realtime_us: int
    unit: str | None
    message: str
    pid: str | None = None


class JournalRead(Struct):
    entries: list[JournalEntry] = field(default_factory=list)
    # More entries were there than the bounds let through (the rest is read next time, from the last cursor).
    more: bool = False
    chars: int = 0


def journal_argv(
    units: Sequence[str],
    *,
    directory: str | None = None,
    after_cursor: str | None = None,
    since_us: int | None = None,
    lines: int | None = None,
    reverse: bool = False,
) -> list[str]:
    """journalctl's argv for ``units``; every value is one ``--option=value`` element, so none reads as an option.
    Raises ValueError for a unit name or cursor that is not one."""
    argv = [JOURNALCTL, "--output=json", f"--output-fields={OUTPUT_FIELDS}", "--no-pager", "--quiet"]
    if directory is not None:
        argv.append(f"--directory={directory}")
    for unit in units:
        if not UNIT_NAME_RE.match(unit):
            raise ValueError(f"not a systemd unit name: {unit[:80]!r}")
        argv.append(f"--unit={unit}")
    if after_cursor is not None:
        if not CURSOR_RE.match(after_cursor):
            raise ValueError(f"not a journal cursor: {after_cursor[:80]!r}")
        argv.append(f"--after-cursor={after_cursor}")
    elif since_us is not None:
        argv.append(f"--since=@{since_us // 1_000_000}")  # whole seconds: every journalctl reads them
    if lines is not None:
        argv.append(f"--lines={lines}")
    if reverse:
        argv.append("--reverse")
    return argv


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return None


def parse_entry(line: str, units: Sequence[str]) -> JournalEntry | None:
    """One line of ``journalctl --output=json``; None for a line that is not an entry (or has no cursor). The
    unit is the first of ``UNIT_FIELDS`` that names one of ``units`` (else the first present)."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("__CURSOR"), str):
        return None
    try:
        realtime = int(raw.get("__REALTIME_TIMESTAMP", 0))
    except (TypeError, ValueError):
        realtime = 0
    named = [t for t in (_text(raw.get(f)) for f in UNIT_FIELDS) if t]
    unit = next((u for u in named if u in units), named[0] if named else None)
    pid = _text(raw.get("_PID"))
    return JournalEntry(raw["__CURSOR"], realtime, unit, _text(raw.get("MESSAGE")) or "", pid)


def read_journal(
    run: HeadCommandRunner,
    units: Sequence[str],
    *,
    max_lines: int,
    max_chars: int,
    directory: str | None = None,
    after_cursor: str | None = None,
    since_us: int | None = None,
    reverse: bool = False,
    timeout_s: float = JOURNALCTL_TIMEOUT_S,
) -> JournalRead | str:
    """At most ``max_lines`` entries of ``units`` (from the cursor, or from ``since_us``; the newest first with
    ``reverse``) in at most ``max_chars`` of output; or why journalctl could not read them. Units with no entries
    are no error: the read is empty."""
    argv = journal_argv(
        units, directory=directory, after_cursor=after_cursor, since_us=since_us, lines=max_lines + 1, reverse=reverse
    )
    try:
        done = run(argv, timeout_s, max(max_chars, MIN_CHARS))
    except CommandNotFound as exc:
        return str(exc)
    except CommandTimeout as exc:
        return str(exc)
    except OSError as exc:
        return f"{JOURNALCTL}: {exc.strerror or exc}"
    if done.returncode != 0 and not done.cut:
        err = done.stderr.strip().splitlines()
        return f"journalctl exited {done.returncode}" + (f": {err[-1][:200]}" if err else "")
    lines = done.stdout.split("\n")
    if done.cut or not done.stdout.endswith("\n"):
        lines = lines[:-1]  # the entry the output was cut in: read next time
    read = JournalRead(more=done.cut)
    for line in lines:
        entry = parse_entry(line, units) if line else None
        if entry is None:
            continue
        if len(read.entries) >= max_lines:
            read.more = True
            break
        read.entries.append(entry)
        read.chars += len(line) + 1
    return read


class JournalFollower:
    """The journal of ``units``, followed across runs from a cursor kept in memory (its owner may save it and set
    ``cursor`` again after a restart; without one, the first poll starts at ``since_us``)."""

    def __init__(
        self, run: HeadCommandRunner, units: Sequence[str], directory: str | None, max_lines: int, max_chars: int
    ) -> None:
        self.run = run
        self.units = list(units)
        self.directory = directory
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.cursor: str | None = None
        self._since_us: int | None = None

    def poll(self, since_us: int) -> JournalRead | str:
        """The entries after the cursor; before the first entry was read, those from ``since_us`` of the first
        poll (the window), so nothing that arrives between two polls is missed."""
        if self.cursor is None and self._since_us is None:
            self._since_us = since_us
        read = read_journal(
            self.run, self.units, max_lines=self.max_lines, max_chars=self.max_chars, directory=self.directory,
            after_cursor=self.cursor, since_us=self._since_us,
        )  # fmt: skip
        if not isinstance(read, str) and read.entries:
            self.cursor = read.entries[-1].cursor
        return read

    def recent(self, since_us: int) -> JournalRead | str:
        """The newest entries since ``since_us``, oldest first (the one-shot run: the recent past, no cursor)."""
        read = read_journal(
            self.run, self.units, max_lines=self.max_lines, max_chars=self.max_chars, directory=self.directory,
            since_us=since_us, reverse=True,
        )  # fmt: skip
        if not isinstance(read, str):
            read.entries.reverse()
        return read

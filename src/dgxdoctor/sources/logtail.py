"""Follow growing log files across runs: remember where we stopped, survive rotation, never re-read history.

A position is (device, inode, offset, size) per path, kept as a plain dict so the caller can persist it in a
``StateFile``. What ``LogFollower.poll`` does with each file:

- first sight, on the first poll of this follower: start at its end (``from_start=False``), so a restart of the
  agent does not report old lines again; or at 0 (``from_start=True``);
- first sight on a later poll: the file appeared while we were watching (a new Ray worker's log, a new Ray
  session behind ``session_latest``), so every line in it is new: read from 0;
- the inode or device changed (logrotate's rename-and-create): first finish the old file if it was renamed to
  ``<path>.1`` (same device and inode), from the old offset to its end, then read the new file from 0;
- the file shrank below the offset (copytruncate, or ``> file``): read it again from 0;
- the same inode now starts with other bytes (a file deleted and recreated reusing the inode, which tmpfs and
  ext4 do): treated as a new file, read from 0. The first ``HEAD_BYTES`` read are remembered for this;
- a last line without its newline is left for the next poll, so a line being written is never split;
- bytes that are not UTF-8 are replaced (U+FFFD), never fatal;
- at most ``max_bytes`` are read per poll over all files; the rest waits for the next poll. A single line longer
  than what is left of the budget is cut there rather than stalling the file forever.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct, field

ROTATED_SUFFIX = ".1"
HEAD_BYTES = 128


class Position(Struct, frozen=True):
    dev: int
    ino: int
    offset: int
    # sha256 (first 16 hex digits) of the file's first min(offset, HEAD_BYTES) bytes; "" before any were read.
    head: str = ""

    def to_dict(self) -> dict[str, int | str]:
        return {"dev": self.dev, "ino": self.ino, "offset": self.offset, "head": self.head}

    @classmethod
    def from_dict(cls, raw: Any) -> Position | None:
        if not isinstance(raw, Mapping):
            return None
        try:
            dev, ino, offset = (int(raw[k]) for k in ("dev", "ino", "offset"))
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int(Infinity) from a corrupt file
            return None
        head = raw.get("head", "")
        return cls(dev, ino, offset, head if isinstance(head, str) else "") if offset >= 0 else None


def _head(path: str, length: int) -> str:
    if length <= 0:
        return ""
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(min(length, HEAD_BYTES))
    except OSError:
        return ""
    return hashlib.sha256(data).hexdigest()[:16]


class PollResult(Struct):
    # (path the line was read from, the line without its newline), in file order.
    lines: list[tuple[str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    rotated: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    budget_exhausted: bool = False


def expand_paths(patterns: Iterable[str]) -> list[str]:
    """Files named by paths and globs, sorted and without duplicates; missing plain paths are left out."""
    found: set[str] = set()
    for pattern in patterns:
        if glob.has_magic(pattern):
            found.update(p for p in glob.glob(pattern) if os.path.isfile(p))
        elif os.path.isfile(pattern):
            found.add(pattern)
    return sorted(found)


class LogFollower:
    def __init__(self, positions: Mapping[str, Any] | None = None, *, from_start: bool = False) -> None:
        self.from_start = from_start
        self._polled = False
        self.positions: dict[str, Position] = {}
        for path, raw in (positions or {}).items():
            pos = Position.from_dict(raw)
            if pos is not None:
                self.positions[str(path)] = pos

    def state(self) -> dict[str, dict[str, int | str]]:
        return {path: pos.to_dict() for path, pos in sorted(self.positions.items())}

    def poll(self, paths: Iterable[str], max_bytes: int) -> PollResult:
        result = PollResult()
        budget = max_bytes
        wanted = list(paths)
        for path in wanted:
            try:
                st = os.stat(path)
            except OSError as exc:
                result.errors.append(f"{path}: {exc.strerror or exc}")
                continue
            result.files.append(path)
            old = self.positions.get(path)
            if old is None:
                start = 0 if self.from_start or self._polled else st.st_size
                self.positions[path] = Position(st.st_dev, st.st_ino, start, _head(path, start))
                if start == 0 and st.st_size > 0:
                    budget = self._read(path, result, budget)
                continue
            if (old.dev, old.ino) != (st.st_dev, st.st_ino):
                result.rotated.append(path)
                budget = self._finish_rotated(path, old, result, budget)
                self.positions[path] = Position(st.st_dev, st.st_ino, 0)
            elif st.st_size < old.offset:
                result.truncated.append(path)
                self.positions[path] = Position(st.st_dev, st.st_ino, 0)
            elif old.head and _head(path, old.offset) != old.head:
                result.rotated.append(path)  # recreated on a reused inode
                self.positions[path] = Position(st.st_dev, st.st_ino, 0)
            budget = self._read(path, result, budget)
        # Forget files no longer configured or gone, so the state does not grow forever.
        for path in set(self.positions) - set(result.files):
            del self.positions[path]
        result.budget_exhausted |= budget <= 0
        self._polled = True
        return result

    def _finish_rotated(self, path: str, old: Position, result: PollResult, budget: int) -> int:
        rotated = path + ROTATED_SUFFIX
        try:
            st = os.stat(rotated)
        except OSError:
            return budget
        if (st.st_dev, st.st_ino) != (old.dev, old.ino) or st.st_size <= old.offset:
            return budget
        text, consumed, full = _read_lines(rotated, old.offset, budget, final=True)
        result.lines.extend((rotated, line) for line in text)
        result.budget_exhausted |= full
        return budget - consumed

    def _read(self, path: str, result: PollResult, budget: int) -> int:
        if budget <= 0:
            return budget
        pos = self.positions[path]
        try:
            lines, consumed, full = _read_lines(path, pos.offset, budget, final=False)
        except OSError as exc:
            result.errors.append(f"{path}: {exc.strerror or exc}")
            return budget
        result.lines.extend((path, line) for line in lines)
        result.budget_exhausted |= full
        offset = pos.offset + consumed
        head = pos.head if pos.offset >= HEAD_BYTES and pos.head else _head(path, offset)
        self.positions[path] = Position(pos.dev, pos.ino, offset, head)
        return budget - consumed


def _read_lines(path: str, offset: int, budget: int, *, final: bool) -> tuple[list[str], int, bool]:
    """Complete lines from ``offset``, at most ``budget`` bytes: the lines, the bytes consumed, and whether the
    budget cut the read short (more is waiting).

    ``final`` (a rotated file that will not grow again): a last line without a newline is taken too.
    """
    with Path(path).open("rb") as fh:
        fh.seek(offset)
        chunk = fh.read(budget)
    if not chunk:
        return [], 0, False
    full = len(chunk) >= budget
    end = chunk.rfind(b"\n")
    if end >= 0:
        whole = chunk[: end + 1]
    elif len(chunk) >= budget or final:
        # No newline within the whole budget: cut the overlong line here instead of stalling.
        whole = chunk
    else:
        return [], 0, False
    if final and end >= 0 and end + 1 < len(chunk) and len(chunk) < budget:
        whole = chunk
    text = whole.decode("utf-8", errors="replace")
    return text.splitlines(), len(whole), full


class RecentRead(Struct):
    """What ``read_recent`` read: the lines, and what it left unread and why."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # read (their recent part)
    stale: list[str] = field(default_factory=list)  # not written within max_age_s: not read
    errors: list[str] = field(default_factory=list)
    bytes_read: int = 0
    older_bytes: int = 0  # before the window: older than what the one-shot run looks at
    unread_bytes: int = 0  # inside the window but over the per-run limit


def read_recent(paths: Iterable[str], window_bytes: int, max_bytes: int, max_age_s: float, now: float) -> RecentRead:
    """The recent past of each file, for the one-shot ``check``: its last ``window_bytes`` (from the first whole
    line in them), files not modified within ``max_age_s`` of ``now`` (wall clock) left out, at most ``max_bytes``
    over all files, the newest part of each file first. Positions are neither read nor kept."""
    result = RecentRead()
    budget = max_bytes
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            result.errors.append(f"{path}: {exc.strerror or exc}")
            continue
        if now - st.st_mtime > max_age_s:
            result.stale.append(path)
            continue
        start = max(0, st.st_size - window_bytes)
        take = max(0, min(st.st_size - start, budget))
        result.older_bytes += start
        result.unread_bytes += st.st_size - start - take
        try:
            lines = _read_tail(path, st.st_size - take, take)
        except OSError as exc:
            result.errors.append(f"{path}: {exc.strerror or exc}")
            continue
        result.files.append(path)
        result.lines.extend((path, line) for line in lines)
        result.bytes_read += take
        budget -= take
    return result


def _read_tail(path: str, offset: int, length: int) -> list[str]:
    """The whole lines of ``length`` bytes from ``offset`` (a first line cut by the offset is left out)."""
    if length <= 0:
        return []
    with Path(path).open("rb") as fh:
        fh.seek(max(0, offset - 1))
        chunk = fh.read(length + (1 if offset > 0 else 0))
    if offset > 0:
        # The byte before the window: a newline there means the window starts on a whole line.
        first = chunk.find(b"\n")
        chunk = chunk[first + 1 :] if first != -1 else b""
    return chunk.decode("utf-8", errors="replace").splitlines()

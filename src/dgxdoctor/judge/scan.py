"""The catalog over a stream of log text: fast on the lines that show nothing, exact on the few that might.

A ``Scanner`` takes blocks of whole lines (``feed``) and returns the matches in order, each read as the record
it belongs to (``judge.records``) and, with ``context=True``, in the context of the lines around it
(``judge.context``: the OOM phase, a requested stop). The catalog's prefilter (one regex of every pattern's literal
anchor, ``judge.signatures``) runs over the whole block at once, in C; only the lines it hits are cleaned,
shaped and searched with the patterns, so the cost of a log is the cost of one regex search over its bytes.

What the per-line reading gives is the same as reading every line: the normaliser only takes off prefixes,
colour codes and carriage returns, which never sit inside an anchor; a record wrapped over two lines is found by
the prefilter across the break and read as the two lines joined. Matches are reported one block late, so that
the lines after a match (an OOM's phase) are there when it is read; ``flush`` reads the last block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from dgxdoctor.judge.context import reading
from dgxdoctor.judge.records import RecordReader, Shape, Trust, clean, shape
from dgxdoctor.judge.signatures import Catalog, Match, Signature

# Lines before a match that its reading may look at (judge.oom looks 400 back), and after it (50).
LOOK_BACK = 400
LOOK_AHEAD = 50
# How far back the record that owns a line is looked for (a traceback under a client record).
OWNER_LOOK_BACK = 200
# A line this long or longer may have been wrapped by a mail client, an editor or a terminal.
WRAP_MIN = 40


@dataclass
class _Block:
    lines: list[str]
    first: int  # 0-based number of its first line in the whole input
    hits: list[int] = field(default_factory=list)  # indexes into lines, sorted, the prefilter's candidates


class Scanner:
    """Feed blocks of whole lines; read matches. ``trusted_only``: leave out what a client record shows."""

    def __init__(
        self, catalog: Catalog, kind: str | None = None, *, context: bool = True, trusted_only: bool = False
    ) -> None:
        self.catalog = catalog
        self.kind = kind
        self.context = context
        self.trusted_only = trusted_only
        self.lines_read = 0
        self._tail: list[str] = []
        self._pending: _Block | None = None
        self._signatures = catalog.by_code()

    def feed(self, text: str) -> list[Match]:
        """Read one block of whole lines (no trailing newline needed); the previous block's matches come back."""
        if "\r" in text:  # CRLF, and a carriage return that a terminal showed as a new line (progress bars)
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        block = _Block(lines, self.lines_read, self._hits(text, lines))
        self.lines_read += len(lines)
        out = self._settle(lines[:LOOK_AHEAD])
        self._pending = block
        return out

    def flush(self) -> list[Match]:
        """The matches of the last block fed (nothing after it to read it with)."""
        return self._settle([])

    def _hits(self, text: str, lines: list[str]) -> list[int]:
        """Indexes of the lines the prefilter hits (a hit across a line break names both lines)."""
        prefilter = self.catalog.prefilter
        if prefilter is None:
            return []
        hits: list[int] = []
        index = pos = 0
        for m in prefilter.finditer(text):
            index += text.count("\n", pos, m.start())
            pos = m.start()
            if not hits or hits[-1] != index:
                hits.append(index)
            span = text.count("\n", m.start(), m.end())
            if span:
                hits.append(index + span)
        return sorted(set(h for h in hits if h < len(lines)))

    def _settle(self, ahead: list[str]) -> list[Match]:
        block = self._pending
        if block is None:
            return []
        self._pending = None
        window = [*self._tail, *block.lines, *ahead]
        offset = len(self._tail)
        out = list(self._read_block(window, offset, block)) if block.hits else []
        self._tail = [*self._tail, *block.lines][-LOOK_BACK:]
        return out

    def _read_block(self, window: list[str], offset: int, block: _Block) -> Iterator[Match]:
        reading_ = _Reading(self, window)
        done: set[tuple[int, str]] = set()
        for hit in block.hits:
            for index, sig, line, trust in reading_.candidates(offset + hit):
                if not offset <= index < offset + len(block.lines) or (index, sig.code) in done:
                    continue
                done.add((index, sig.code))
                if trust is Trust.CLIENT and self.trusted_only:
                    continue
                read: Signature | None = sig
                if self.context:
                    read = reading(sig, window, index, self._signatures)
                if read is not None:
                    number = block.first + index - offset + 1
                    yield Match(read, line, trust is Trust.TRUSTED, number)


class _Reading:
    """The lines of one window read as records: each line's shape (with the record that owns it, looked up
    backwards), what it shows alone, and what it shows joined with a wrapped neighbour."""

    def __init__(self, scanner: Scanner, window: list[str]) -> None:
        self.catalog, self.kind, self.window = scanner.catalog, scanner.kind, window
        self._owners = _Owners(window)
        self._alone: dict[int, list[Signature]] = {}

    def alone(self, index: int) -> list[Signature]:
        if index not in self._alone:
            own = self._owners.shape(index)
            found: list[Signature] = []
            if own.trust is not Trust.DENIED:
                text = clean(self.window[index])
                found = self.catalog.find(text, self.kind, start=own.message, quoted=own.trust is not Trust.CLIENT)
            self._alone[index] = found
        return self._alone[index]

    def candidates(self, index: int) -> Iterator[tuple[int, Signature, str, Trust]]:
        """The signatures of line ``index`` on its own, then of it joined with a wrapped line before or after."""
        own = self._owners.shape(index)
        for sig in self.alone(index):
            yield index, sig, self.window[index], own.trust
        for first in (index - 1, index):
            joined = self._joined(first)
            if joined is None:
                continue
            head, texts = joined
            seen = {s.code for s in [*self.alone(first), *self.alone(first + 1)]}
            quoted = head.trust is not Trust.CLIENT
            found = {s.code: s for t in texts for s in self.catalog.find(t, self.kind, quoted=quoted)}
            for sig in found.values():
                if sig.code not in seen:
                    yield first, sig, self.window[first] + "\n" + self.window[first + 1], head.trust

    def _joined(self, first: int) -> tuple[Shape, tuple[str, str]] | None:
        """Lines ``first`` and ``first + 1`` as one record, when the second reads as the rest of the first."""
        window = self.window
        if first < 0 or first + 1 >= len(window):
            return None
        head = self._owners.shape(first)
        if head.trust is Trust.DENIED:
            return None
        one, two = clean(window[first]), window[first + 1]
        if len(one) < WRAP_MIN or not two or two[:1].isspace():
            return None
        rest = clean(two)
        if not rest or shape(rest).head:
            return None
        one = one[head.message :]
        # Both joins: a terminal cuts inside a word ("colle" / "ctive"), a mail client drops the space it broke at.
        return head, (one + rest, one + ("" if one.endswith(" ") else " ") + rest)


class _Owners:
    """The trust of lines of a window, each read with the record that owns it (looked up backwards, cached)."""

    def __init__(self, window: list[str]) -> None:
        self.window = window
        self._shapes: dict[int, Shape] = {}
        self._reader = RecordReader()
        self._read_to = -1

    def shape(self, index: int) -> Shape:
        if index in self._shapes:
            return self._shapes[index]
        if index <= self._read_to:
            return shape(clean(self.window[index]))
        start = max(self._read_to + 1, index - OWNER_LOOK_BACK, 0)
        if start > self._read_to + 1:
            self._reader.reset()
        for i in range(start, index + 1):
            self._shapes[i] = self._reader.read(clean(self.window[i]))
        self._read_to = max(self._read_to, index)
        return self._shapes[index]

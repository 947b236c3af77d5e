"""The catalog over a stream of log text: fast on the lines that show nothing, exact on the few that might.

A ``Scanner`` takes blocks of whole lines (``feed``) and returns the matches in order, each read as the record
it belongs to (``judge.records``) and, with ``context=True``, in the context of the lines around it
(``judge.context``: the OOM phase, a requested stop). The catalog's prefilter (one regex of every pattern's literal
anchor, ``judge.signatures``) runs over the whole block at once, in C; a line it hits goes with its two joins
(below) through one pass of the catalog's RE2 ``Set`` of whole patterns (``Catalog.may_match``), and only the
lines that pass are cleaned, shaped and searched with the patterns: a line that merely shares a word with a
signature ("Unable to" in a kernel line) costs one pass of an automaton, and the cost of a log is about that of
one regex search over its bytes.

What the per-line reading gives is the same as reading every line: the normaliser only takes off prefixes,
colour codes and carriage returns, which never sit inside an anchor; a record wrapped over two lines is found by
the prefilter across the break and read as the two lines joined. Matches are reported one block late, so that
the lines after a match (an OOM's phase) are there when it is read; ``flush`` reads the last block.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator
from functools import cache

from msgspec import Struct, field

from dgxdoctor.judge.context import reading
from dgxdoctor.judge.records import ANSI_HINT, CLIENT_SOURCE, PREFIXES, Shape, Trust, clean, may_hold_colour, shape
from dgxdoctor.judge.signatures import BytesSearch, Catalog, Match, Signature, block_regex

# Lines before a match that its reading may look at (judge.oom looks 400 back), and after it (50).
LOOK_BACK = 400
LOOK_AHEAD = 50
# How far back the record that owns a line is looked for (a traceback under a client record).
OWNER_LOOK_BACK = 200
# What every line that may open a client record holds (see _Owners); RE2 runs it in linear time (Python's engine
# tries each ``\w*`` of CLIENT_SOURCE from every place: ~2 MB/s).
CLIENT_HINT = "|".join((CLIENT_SOURCE.pattern, ANSI_HINT.pattern, r"\x1b", r"\r"))
# A line this long or longer may have been wrapped by a mail client, an editor or a terminal.
WRAP_MIN = 40


class _Block(Struct):
    data: bytes  # whole lines, each ending in b"\n"
    first: int  # 0-based number of its first line in the whole input
    lines: int
    hits: list[int] = field(default_factory=list)  # byte offsets in data of the lines the prefilter hit, sorted
    hit_lines: list[int] = field(default_factory=list)  # their 0-based line numbers in data


def _counted(data: bytes, hits: list[int]) -> tuple[int, list[int]]:
    """The lines of ``data`` and the line number of each hit, from one count of its line breaks."""
    numbers, line, pos = [], 0, 0
    for hit in hits:
        line += data.count(b"\n", pos, hit)
        numbers.append(line)
        pos = hit
    return line + data.count(b"\n", pos), numbers


def scan_text(catalog: Catalog, text: str, kind: str | None = None) -> list[Match]:
    """Every match of ``catalog`` in a block of text, line by line, in order (each line read in its record, without
    the context of the lines around it)."""
    scanner = Scanner(catalog, kind, context=False)
    return [*scanner.feed(text), *scanner.flush()]


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
        self._tail = b""  # the last LOOK_BACK lines settled, for the context of the next block's matches
        self._pending: _Block | None = None
        self._signatures = catalog.by_code()

    def feed(self, data: bytes | str) -> list[Match]:
        """Read one block of whole lines; the matches of the block before it come back (see the module doc)."""
        if isinstance(data, str):
            data = data.encode("utf-8", errors="surrogatepass")
        if b"\r" in data:  # CRLF, and a carriage return a terminal showed as a new line (progress bars)
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if data and not data.endswith(b"\n"):
            data += b"\n"
        hits = self._hits(data)
        lines, hit_lines = _counted(data, hits)
        block = _Block(data, self.lines_read, lines, hits, hit_lines)
        self.lines_read += block.lines
        out = self._settle(data)
        self._pending = block
        return out

    def flush(self) -> list[Match]:
        """The matches of the last block fed (nothing after it to read it with)."""
        return self._settle(b"")

    def _hits(self, data: bytes) -> list[int]:
        """Line starts (byte offsets) of the lines the prefilter hits; a hit across a line break names both.
        After a hit the search goes on at the next line: a line of a thousand anchors costs one hit."""
        starts: list[int] = []
        pos, prefilter = 0, self.catalog.block_prefilter
        while (m := prefilter.search(data, pos)) is not None:
            starts.append(data.rfind(b"\n", 0, m.start()) + 1)
            end = data.rfind(b"\n", m.start(), m.end())
            if end != -1:
                starts.append(end + 1)
            nxt = data.find(b"\n", m.end())
            if nxt == -1:
                break
            pos = nxt + 1
        return sorted(set(starts))

    def _settle(self, ahead: bytes) -> list[Match]:
        block = self._pending
        if block is None:
            return []
        self._pending = None
        out: list[Match] = []
        if block.hits:
            out = list(self._read_hits(block, ahead))
        data = block.data if block.lines >= LOOK_BACK else self._tail + block.data
        self._tail = _last_lines(data, LOOK_BACK)
        return out

    def _read_hits(self, block: _Block, ahead: bytes) -> Iterator[Match]:
        """Decode only the lines around the hits: LOOK_BACK before and LOOK_AHEAD after each run of hits that
        lie closer together than that (the logs check feeds what a poll read as one block: a 16 MB block with
        a hit near each end decodes two windows, not 16 MB)."""
        kept = [(h, n) for h, n in zip(block.hits, block.hit_lines, strict=True) if self._worth_reading(block.data, h)]
        if not kept:
            return
        buffer = self._tail + block.data + _first_lines(ahead, LOOK_AHEAD)
        base = len(self._tail)
        done: set[tuple[int, str]] = set()  # (line number in the input, code): each once, whichever hit found it
        for hits, hit_lines in _runs([h for h, _ in kept], [n for _, n in kept]):
            start = _line_start_before(buffer, base + hits[0], LOOK_BACK)
            stop = _line_end_after(buffer, base + hits[-1], LOOK_AHEAD)
            window = buffer[start:stop].decode("utf-8", errors="replace").split("\n")
            # The line number (0-based, in the whole input) of the window's first line, from the first hit's.
            first = block.first + hit_lines[0] - buffer.count(b"\n", start, base + hits[0])
            first_in_block = block.first - first
            indexes = [first_in_block + n for n in hit_lines]
            source = (buffer, start, stop)
            yield from self._read_block(window, source, first, indexes, first_in_block, block, done)

    def _worth_reading(self, data: bytes, hit: int) -> bool:
        """Whether the hit line that starts at ``hit`` can show a signature, on its own or joined with a
        neighbour as a wrapped record (``_Reading.candidates``): one pass of the catalog's automaton over the line
        and the two joins (``Catalog.may_match``), before any of it is cleaned, shaped or searched line by line.

        What the reading searches is a part of one of these texts: a cleaned line is the line less a prefix,
        except where cleaning takes out a colour code or a carriage return (those lines, and text that is not
        ASCII, are read in full), and the second line of a join is cleaned here when a prefix may open it. A hit
        on the first or last line of the block is read in full (its neighbour lies in another block)."""
        end = data.find(b"\n", hit)
        if hit == 0 or end + 1 >= len(data):
            return True
        before = data.rfind(b"\n", 0, hit - 1) + 1
        after = data.find(b"\n", end + 1)
        raw = data[before : after if after != -1 else len(data)]
        if not raw.isascii() or b"\x1b" in raw or ANSI_HINT_BYTES.search(raw) is not None:
            return True
        prev, line, nxt = raw.decode("ascii").split("\n")[:3]
        two, three = _as_second(line), _as_second(nxt)
        probe = "\n".join((line, prev + two, prev + " " + two, line + three, line + " " + three))
        return self.catalog.may_match(probe)

    def _read_block(
        self,
        window: list[str],
        source: _Source,
        first: int,
        indexes: list[int],
        lo: int,
        block: _Block,
        done: set[tuple[int, str]],
    ) -> Iterator[Match]:
        """The matches of the hit lines ``indexes`` of ``window`` (decoded from ``source``); only lines of the
        block (``lo`` on) count."""
        reading_ = _Reading(self, window, source)
        hi = lo + block.lines
        for hit in indexes:
            for index, sig, line, trust in reading_.candidates(hit):
                if not lo <= index < hi or (first + index, sig.code) in done:
                    continue
                done.add((first + index, sig.code))
                if trust is Trust.CLIENT and self.trusted_only:
                    continue
                read: Signature | None = sig
                if self.context:
                    read = reading(sig, window, index, self._signatures)
                if read is not None:
                    yield Match(read, line, trust is Trust.TRUSTED, first + index + 1)


def _runs(hits: list[int], lines: list[int]) -> Iterator[tuple[list[int], list[int]]]:
    """The hits (offsets, line numbers) in runs: a run ends where the next hit is more than the lines a window
    holds around a hit away (every reading looks at most LOOK_BACK lines back and LOOK_AHEAD ahead)."""
    begin = 0
    for n in range(1, len(hits) + 1):
        if n == len(hits) or lines[n] - lines[n - 1] > LOOK_BACK + LOOK_AHEAD:
            yield hits[begin:n], lines[begin:n]
            begin = n


def _last_lines(data: bytes, n: int) -> bytes:
    """The last ``n`` whole lines of ``data`` (which ends in a newline)."""
    return data[_line_start_before(data, len(data), n) :]


def _first_lines(data: bytes, n: int) -> bytes:
    return data[: _line_end_after(data, 0, n - 1)] if data else b""


# Bytes per line first guessed when looking for the n-th line break before or after a place (grown as needed).
_GUESS_LINE_BYTES = 160


def _line_start_before(data: bytes, pos: int, n: int) -> int:
    """The start of the line ``n`` lines before the one that starts at ``pos`` (0 when there are fewer): the
    ``n``-th line break before the one that ends the line above, found by one ``rsplit`` over a stretch of bytes
    that holds it rather than by ``n`` searches."""
    if n <= 0:
        return pos
    end = pos - 1  # the line break that ends the line above is not counted
    if end <= 0:
        return 0
    span = n * _GUESS_LINE_BYTES
    while True:
        lo = max(0, end - span)
        parts = data[lo:end].rsplit(b"\n", n)
        if len(parts) > n:
            return lo + len(parts[0]) + 1
        if lo == 0:
            return 0
        span *= 4


def _line_end_after(data: bytes, pos: int, n: int) -> int:
    """The end (without its newline) of the line ``n`` lines after the one holding ``pos``."""
    span = (n + 1) * _GUESS_LINE_BYTES
    while True:
        hi = min(len(data), pos + span)
        parts = data[pos:hi].split(b"\n", n + 1)
        if len(parts) > n + 1:
            return hi - len(parts[-1]) - 1
        if hi == len(data):
            return len(data)
        span *= 4


# The bytes a window was decoded from: the buffer, and where the window starts and stops in it.
_Source = tuple[bytes, int, int]


class _Reading:
    """The lines of one window read as records: each line's shape (with the record that owns it, looked up
    backwards), what it shows alone, and what it shows joined with a wrapped neighbour."""

    def __init__(self, scanner: Scanner, window: list[str], source: _Source) -> None:
        self.catalog, self.kind, self.window = scanner.catalog, scanner.kind, window
        self._owners = _Owners(window, source)
        self._alone: dict[int, list[Signature]] = {}

    def alone(self, index: int) -> list[Signature]:
        if index not in self._alone:
            found: list[Signature] = []
            if self._may_match(index):
                own = self._owners.shape(index)
                if own.trust is not Trust.DENIED:
                    text = self._owners.cleaned(index)
                    quoted = own.trust is not Trust.CLIENT
                    found = self.catalog.find(text, self.kind, start=own.message, quoted=quoted)
            self._alone[index] = found
        return self._alone[index]

    def _may_match(self, index: int) -> bool:
        """Whether line ``index`` can show a signature on its own: the catalog reads a part of the line cleaned,
        which is a part of the line itself unless cleaning takes out a carriage return or a colour code."""
        line = self.window[index]
        return "\r" in line or may_hold_colour(line) or self.catalog.may_match(line)

    def candidates(self, index: int) -> Iterator[tuple[int, Signature, str, Trust]]:
        """The signatures of line ``index`` on its own, then of it joined with a wrapped line before or after."""
        found_alone = self.alone(index)
        if found_alone:
            own = self._owners.shape(index)
            for sig in found_alone:
                yield index, sig, self.window[index], own.trust
        for first in (index - 1, index):
            joined = self._joined(first)
            if joined is None:
                continue
            head, texts = joined
            if not self.catalog.may_match("\n".join(texts)):  # one pass of the automaton for both joins
                continue
            quoted = head.trust is not Trust.CLIENT
            found = {s.code: s for t in texts for s in self.catalog.find(t, self.kind, quoted=quoted)}
            if not found:
                continue
            seen = {s.code for s in [*self.alone(first), *self.alone(first + 1)]}
            for sig in found.values():
                if sig.code not in seen:
                    yield first, sig, self.window[first] + "\n" + self.window[first + 1], head.trust

    def _joined(self, first: int) -> tuple[Shape, tuple[str, str]] | None:
        """Lines ``first`` and ``first + 1`` as one record, when the second reads as the rest of the first."""
        window = self.window
        if first < 0 or first + 1 >= len(window):
            return None
        two = window[first + 1]
        if not two or two[:1].isspace():  # the cheap tests first: most lines are no wrapped record
            return None
        one = self._owners.cleaned(first)
        if len(one) < WRAP_MIN:
            return None
        rest = self._owners.cleaned(first + 1)
        if not rest or self._owners.own(first + 1).head:
            return None
        head = self._owners.shape(first)
        if head.trust is Trust.DENIED:
            return None
        one = one[head.message :]
        # Both joins: a terminal cuts inside a word ("colle" / "ctive"), a mail client drops the space it broke at.
        return head, (one + rest, one + ("" if one.endswith(" ") else " ") + rest)


# Where clean() may take a prefix off a line (a line it leaves alone is its own cleaned text).
_PREFIX_START = re.compile("|".join(f"(?:{p.pattern})" for p in PREFIXES))
ANSI_HINT_BYTES = re.compile(ANSI_HINT.pattern.encode())


def _as_second(line: str) -> str:
    """What ``_Reading._joined`` appends of ``line`` as the second line of a wrapped record (cleaned), or a text
    that holds it."""
    return clean(line) if _PREFIX_START.match(line) else line


@cache
def _client_hint() -> BytesSearch | None:
    """CLIENT_HINT in RE2; None without it (Python's engine would cost more than the look-back it saves)."""
    try:
        import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401
    except ImportError:
        return None
    return block_regex(CLIENT_HINT)


class _Owners:
    """The trust of lines of a window, each read with the record that owns it: the nearest line before it that
    opens a record (at most OWNER_LOOK_BACK back), cached. Only a client record's head changes what a line reads
    as: where none of the OWNER_LOOK_BACK lines before a line can be one, the line is read on its own."""

    def __init__(self, window: list[str], source: _Source) -> None:
        self.window = window
        self._source = source
        self._shapes: dict[int, Shape] = {}
        self._cleaned: dict[int, str] = {}
        self._client_lines: list[int] | None = None

    def cleaned(self, index: int) -> str:
        """``clean`` of line ``index``, once per window (a hit's lines are read alone, joined and as owners)."""
        if index not in self._cleaned:
            self._cleaned[index] = clean(self.window[index])
        return self._cleaned[index]

    def own(self, index: int) -> Shape:
        """The shape of line ``index`` on its own (``records.shape`` of it cleaned), once per window."""
        if index not in self._shapes:
            self._shapes[index] = shape(self.cleaned(index))
        return self._shapes[index]

    def _may_open_client_record(self, lo: int, hi: int) -> bool:
        """Whether a line of ``lo`` to ``hi`` (exclusive) may open a client record: its text names a client
        source file (``records.CLIENT_SOURCE``), or cleaning may change more than its start (a colour code, a
        carriage return). Found for the whole window in one search, on the first question."""
        hint = _client_hint()
        if hint is None:
            return True
        if self._client_lines is None:
            data, pos, stop = self._source  # the window's bytes, searched where they lie (no copy)
            lines: list[int] = []
            line = 0
            for m in hint.finditer(data, pos, stop):
                line += data.count(b"\n", pos, m.start())
                pos = m.start()
                if not lines or lines[-1] != line:
                    lines.append(line)
            self._client_lines = lines
        n = bisect_left(self._client_lines, lo)
        return n < len(self._client_lines) and self._client_lines[n] < hi

    def shape(self, index: int) -> Shape:
        own = self.own(index)
        if own.head:
            return own
        lo = max(0, index - OWNER_LOOK_BACK)
        if not self._may_open_client_record(lo, index):
            return own
        for back in range(index - 1, lo - 1, -1):
            head = self.own(back)
            if head.head:
                if head.trust is Trust.CLIENT:
                    return Shape(Trust.CLIENT, own.message, False)
                return own
        return own

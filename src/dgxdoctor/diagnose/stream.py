"""`dgxdoctor diagnose` over a stream: a day of ``journalctl -u vllm`` or a 1 GB log, in bounded memory.

The input is read in blocks of ``BLOCK`` bytes and never held whole. The failure catalog reads every line
(``judge.scan``); the section kinds (a tool's output: ibstat, ``ray status``, nccl-tests ...) are judged on the
first ``HEAD_BYTES``, where such a paste sits, and an input that fits there is read exactly as a paste. A line
over ``MAX_LINE`` bytes is cut there (the catalog reads a line's first 16 KiB) and the cut is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, BinaryIO

from msgspec import Struct

from dgxdoctor.diagnose.base import Diagnosis, unrecognized
from dgxdoctor.diagnose.logs import Tally
from dgxdoctor.judge.scan import Scanner
from dgxdoctor.judge.signatures import load_catalog

if TYPE_CHECKING:
    from dgxdoctor.diagnose.registry import Thresholds

BLOCK = 1 << 20
HEAD_BYTES = 1 << 20
MAX_LINE = 64 << 10


class StreamStats(Struct):
    """What was read: bytes, lines cut at ``MAX_LINE``; ``progress`` is called with the bytes read so far."""

    bytes_read: int = 0
    lines_cut: int = 0
    progress: Callable[[int], None] | None = None


def blocks(fh: BinaryIO, stats: StreamStats, size: int = BLOCK) -> Iterator[bytes]:
    """Blocks of whole lines (each ending in a newline), no line longer than ``MAX_LINE``."""
    carry = b""
    skipping = False  # inside the rest of a line already cut
    while chunk := fh.read(size):
        stats.bytes_read += len(chunk)
        if stats.progress is not None:
            stats.progress(stats.bytes_read)
        if skipping:
            end = chunk.find(b"\n")
            if end == -1:
                continue
            chunk, skipping = chunk[end + 1 :], False
        end = chunk.rfind(b"\n")  # the carry holds no line break
        if end == -1:
            whole, carry = b"", carry + chunk
        else:  # one copy of the block, not two
            whole, carry = b"".join((carry, memoryview(chunk)[: end + 1])), chunk[end + 1 :]
        if len(carry) > MAX_LINE:
            whole, carry, skipping = whole + carry[:MAX_LINE] + b"\n", b"", True
            stats.lines_cut += 1
        if whole:
            yield _cut_long_lines(whole, stats)
    if carry:
        yield _cut_long_lines(carry + b"\n", stats)


def _cut_long_lines(data: bytes, stats: StreamStats) -> bytes:
    """``data`` with every line cut to ``MAX_LINE`` bytes; a block whose every stretch of ``MAX_LINE`` bytes holds
    a newline (nearly all) is returned as it is after a few ``find`` calls."""
    step = MAX_LINE // 2
    if all(data.find(b"\n", pos, pos + MAX_LINE) != -1 for pos in range(0, max(1, len(data) - MAX_LINE), step)):
        return data
    lines = data.split(b"\n")
    cut = [line[:MAX_LINE] for line in lines]
    stats.lines_cut += sum(1 for line in lines if len(line) > MAX_LINE)
    return b"\n".join(cut)


def diagnose_stream(
    fh: BinaryIO,
    kind: str | None = None,
    thresholds: Thresholds | None = None,
    stats: StreamStats | None = None,
) -> Sequence[Diagnosis]:
    """What ``dgxdoctor diagnose`` reports for one input read from ``fh``."""
    from dgxdoctor.diagnose.registry import COMPRESSED_MAGIC, LINE_READERS, CompressedInput, diagnose_bytes, sections

    stats = stats or StreamStats()
    scanner = Scanner(load_catalog())
    head = bytearray()
    head_open = True
    tally = Tally()
    for block in blocks(fh, stats):
        if not head:
            for magic, name, reader in COMPRESSED_MAGIC:  # before reading a gigabyte of it
                if block.startswith(magic):
                    raise CompressedInput(name, reader)
        if head_open:  # the whole lines of the first HEAD_BYTES (a block of whole lines ends a little short of it)
            room = HEAD_BYTES - len(head)
            if len(block) <= room or stats.bytes_read <= HEAD_BYTES:
                head += block
            else:
                head += block[: block.rfind(b"\n", 0, room) + 1]
                head_open = False
        tally.add(scanner.feed(block))
    tally.add(scanner.flush())
    if stats.bytes_read <= HEAD_BYTES:
        return diagnose_bytes(bytes(head), kind, thresholds)
    text = bytes(head).decode("utf-8", errors="replace")
    # Longer than a paste: the sections from its head, the catalog from every line.
    found = sections(thresholds)
    if kind is not None:
        chosen = next((a for a in (*found, *LINE_READERS) if a.kind == kind), None)
        if chosen is None:
            raise ValueError(f"unknown kind {kind!r}")
        if chosen in found:
            return (chosen.analyze(text),)
    listed = tally.findings(text.splitlines(), scanner.catalog.by_code())
    data = {
        "lines": scanner.lines_read,
        "matches": tally.counts,
        "bytes": stats.bytes_read,
        "sections_read_bytes": HEAD_BYTES,
    }
    if kind is not None:
        return (Diagnosis(kind, tuple(listed), data),)
    out = [a.analyze(text) for a in found if a.detect(text)]
    read_as = next((a.kind for a in LINE_READERS[:-1] if a.detect(text)), "text" if listed else "")
    if read_as and (listed or not out):
        out.append(Diagnosis(read_as, tuple(listed), data))
    return tuple(out) or (unrecognized([*found, *LINE_READERS]),)

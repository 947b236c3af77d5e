"""`diagnose` reads its input as a stream: more than the old 64 MiB limit in bounded memory, lines over 64 KiB cut
and counted, the same findings as a paste for what fits in one."""

from __future__ import annotations

import io
import tracemalloc

import pytest

from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.diagnose.stream import HEAD_BYTES, MAX_LINE, StreamStats, blocks, diagnose_stream

HEALTHY = b"INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds\n"
# vllm-project/vllm#5094 (tests/fixtures/logs/gloo_socket.log)
FAILURE = (
    b"ERROR 05-29 04:08:22 worker_base.py:145] RuntimeError: Gloo connectFullMesh failed with [pair.cc:144] no error\n"
)


class Generated(io.RawIOBase):
    """``size`` bytes of healthy lines, then one failure line, made as they are read (never held whole)."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.tail = FAILURE

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self.left <= 0:
            data, self.tail = self.tail, b""
        else:
            data = HEALTHY * max(1, min(len(buffer), self.left) // len(HEALTHY))
            self.left -= len(data)
        buffer[: len(data)] = data
        return len(data)


def test_an_input_over_64_mib_is_read_in_bounded_memory() -> None:
    tracemalloc.start()
    try:
        stats = StreamStats()
        found = diagnose_stream(io.BufferedReader(Generated(70 << 20), 1 << 20), stats=stats)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.bytes_read > 64 << 20
    codes = [f.code for d in found for f in d.findings]
    assert codes == ["GLOO_SOCKET"]
    assert peak < 48 << 20, peak  # blocks of 1 MiB and the first 1 MiB for the section kinds


def test_a_line_over_64_kib_is_cut_and_counted() -> None:
    text = HEALTHY + b"x" * (MAX_LINE * 3) + b"\n" + FAILURE
    stats = StreamStats()
    read = b"".join(blocks(io.BytesIO(text), stats, size=4096))
    assert stats.lines_cut == 1
    assert max(len(line) for line in read.split(b"\n")) == MAX_LINE
    assert read.endswith(FAILURE)
    found = diagnose_stream(io.BytesIO(text), stats=StreamStats())
    assert "GLOO_SOCKET" in {f.code for d in found for f in d.findings}


def test_a_paste_reads_as_before() -> None:
    paste = HEALTHY * 3 + FAILURE
    streamed = diagnose_stream(io.BytesIO(paste))
    assert [(d.kind, [f.code for f in d.findings]) for d in streamed] == [
        (d.kind, [f.code for f in d.findings]) for d in diagnose(paste.decode())
    ]


def test_the_sections_read_the_whole_lines_of_the_first_mib_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The section kinds judge the head (``HEAD_BYTES``): before, a block of whole lines ends a little short of
    1 MiB, so the next block went in whole and the head was nearly 2 MiB, every section's test run twice as long."""
    from dgxdoctor.diagnose import logs

    seen: list[str] = []
    detect = logs.VllmLogAnalyzer.detect
    monkeypatch.setattr(logs.VllmLogAnalyzer, "detect", lambda self, text: seen.append(text) or detect(self, text))
    (result,) = diagnose_stream(Generated(5 * HEAD_BYTES))
    assert result.kind == "vllm-log"
    assert seen
    assert all(HEAD_BYTES - len(HEALTHY) < len(text.encode()) <= HEAD_BYTES for text in seen)
    assert all(text.endswith("seconds\n") for text in seen)

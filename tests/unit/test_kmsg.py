"""/dev/kmsg record parsing and the non-blocking reader (real records captured on the project machine)."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgxdoctor.sources.kmsg import (
    KmsgFollower,
    KmsgFormatError,
    KmsgReader,
    parse_kmsg_record,
    records_since,
    text_records,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log" / "kmsg_records_debian12_vm.txt"


def _raw_records() -> list[str]:
    """Split the capture into one string per record, as one read() of /dev/kmsg returns it."""
    records: list[str] = []
    for line in FIXTURE.read_text().splitlines(keepends=True):
        if line.startswith(" ") and records:
            records[-1] += line
        else:
            records.append(line)
    return records


def test_kernel_record_fields() -> None:
    record = parse_kmsg_record(_raw_records()[0])
    assert (record.facility, record.level, record.seq, record.usec, record.flags) == (0, 5, 0, 0, "-")
    assert record.message.startswith("Linux version 6.18.44")


def test_continuation_lines_are_metadata_not_message() -> None:
    record = parse_kmsg_record(_raw_records()[2])
    assert record.seq == 193 and record.usec == 302228
    assert record.meta == {"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A08:00"}
    assert "SUBSYSTEM" not in record.message


def test_user_space_write_carries_user_facility() -> None:
    record = parse_kmsg_record(_raw_records()[3])
    # Written as "<4>NVRM: Xid ..." by root: the kernel forces facility 1 (user), level 4.
    assert (record.facility, record.level) == (1, 4)
    assert record.message.startswith("NVRM: Xid (PCI:0000:10:1c): 63,")


def test_escaped_bytes_are_decoded_and_split_into_lines() -> None:
    record = parse_kmsg_record(_raw_records()[4])
    assert record.lines == ["NVRM: dgxdoctor kmsg format capture\x01 first", "second part"]


def test_extra_header_fields_after_flags_are_accepted() -> None:
    record = parse_kmsg_record("6,1301,97612345678,-,caller=T4242;NVRM: hello\n")
    assert (record.seq, record.usec, record.message) == (1301, 97612345678, "NVRM: hello")


@pytest.mark.parametrize("raw", ["", "NVRM: Xid (PCI:0000:3b:00): 79", "6,x,1,-;msg", "6,1,2-;msg"])
def test_not_a_record_names_the_problem(raw: str) -> None:
    with pytest.raises(KmsgFormatError, match="not a kmsg record"):
        parse_kmsg_record(raw)


def test_records_since_keeps_untimed_lines() -> None:
    records = [parse_kmsg_record(r) for r in _raw_records()] + list(text_records("plain line\n"))
    kept = records_since(records, 600_000_000)
    assert [r.seq for r in kept] == [356, 358, None]


def _fake_device(chunks: list[bytes | int]) -> tuple[Iterator[bytes | int], object]:
    it = iter(chunks)

    def read(fd: int, size: int) -> bytes:
        item = next(it, None)
        if item is None:
            raise BlockingIOError(errno.EAGAIN, "no more")
        if isinstance(item, int):
            raise OSError(item, "fake")
        return item

    return it, read


def test_overrun_counts_lost_records_and_reading_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    _, read = _fake_device(
        [b"6,10,1,-;first\n", b"6,11,2,-;second\n", errno.EPIPE, b"6,20,3,-;after overrun\n", b"6,21,4,-;last\n"]
    )
    reader = KmsgReader(path, read=read, device=True)  # type: ignore[arg-type]
    records = reader.read_available()
    assert [r.message for r in records] == ["first", "second", "after overrun", "last"]
    assert reader.stats.lost == 8  # seq 12..19
    assert reader.stats.overruns == 1
    assert reader.stats.records == 4


def test_a_malformed_record_is_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    _, read = _fake_device([b"garbage\n", b"6,1,1,-;fine\n"])
    reader = KmsgReader(path, read=read, device=True)  # type: ignore[arg-type]
    assert [r.message for r in reader.read_available()] == ["fine"]
    assert reader.stats.malformed == 1


def test_text_log_is_read_incrementally_and_partial_lines_wait(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("line one\nline two\n")
    reader = KmsgReader(path)
    assert [r.message for r in reader.read_available()] == ["line one", "line two"]
    assert reader.read_available() == []
    with path.open("a") as fh:
        fh.write("line three\npartial")
    assert [r.message for r in reader.read_available()] == ["line three"]
    with path.open("a") as fh:
        fh.write(" now complete\n")
    assert [r.message for r in reader.read_available()] == ["partial now complete"]
    path.write_text("rotated\n")  # truncated: start over
    assert [r.message for r in reader.read_available()] == ["rotated"]
    reader.close()


def test_missing_path_raises_for_the_caller(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        KmsgReader(tmp_path / "nope").read_available()


def test_nvidia_driver_records_from_the_h200_machine() -> None:
    raw = (FIXTURE.parent / "kmsg_records_h200_580.txt").read_text().splitlines(keepends=True)
    records = [parse_kmsg_record(line) for line in raw]
    assert [(r.facility, r.level, r.flags) for r in records] == [
        (0, 4, "-"),
        (0, 6, "-"),
        (0, 3, "-"),
        (0, 4, "c"),
        (0, 4, "c"),
    ]
    assert records[2].message.startswith("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04")


def test_reopened_device_does_not_return_records_twice(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    _, read = _fake_device([b"6,1,1,-;one\n", b"6,2,2,-;two\n"])
    reader = KmsgReader(path, read=read, device=True)  # type: ignore[arg-type]
    assert len(reader.read_available()) == 2
    reader.close()
    _, reader._read = _fake_device([b"6,1,1,-;one\n", b"6,2,2,-;two\n", b"6,3,3,-;three\n"])  # type: ignore[assignment]
    assert [r.message for r in reader.read_available()] == ["three"]


def test_an_idle_follower_waits_in_poll_until_a_record_or_stop(tmp_path: Path) -> None:
    """A followed device is read when poll says a record arrived, not on a timer; stop ends the wait (its pipe)."""
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    reads: list[int] = []

    def read(fd: int, n: int) -> bytes:
        reads.append(n)
        return os.read(fd, n)

    arrived = threading.Event()
    got: list[str] = []
    follower = KmsgFollower(KmsgReader(fifo, read=read, device=True), lambda b: (got.extend(r.message for r in b),
                            arrived.set()))  # fmt: skip
    follower.start()
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, b"6,1,1,-;hello\n")
        assert arrived.wait(10) and got == ["hello"]
        seen = len(reads)
        time.sleep(0.6)  # three of the 0.2 s timer's reads, had it been one
        assert len(reads) == seen
        follower.stop()
        assert not follower.running
    finally:
        follower.stop()
        os.close(writer)

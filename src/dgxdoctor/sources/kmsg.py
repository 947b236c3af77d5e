"""The kernel log: ``/dev/kmsg`` records, read once (look-back) or followed, and plain-text logs.

Record format (Documentation/ABI/testing/dev-kmsg): one ``read()`` returns one record::

    6,1234,5678901234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.
     SUBSYSTEM=pci
     DEVICE=+pci:0000:3b:00.0

``prio`` is ``facility << 3 | level``; ``seq`` a 64-bit sequence number that grows by one per record;
``usec`` the time since boot in microseconds (the kernel's local clock, which is CLOCK_MONOTONIC
on the machines we care about); ``flags`` is ``-`` or ``c``/``+`` for continuation fragments. Lines
after the first start with a space and carry KEY=value metadata. Non-printable bytes in the message
(an embedded newline included) are escaped as ``\\xNN``.

A reader that falls behind the ring buffer gets ``EPIPE`` once; the next read returns the oldest
record still held. The records skipped are counted from the gap in sequence numbers.

Following: a :class:`KmsgFollower` runs one daemon thread that ``poll()``s a non-blocking descriptor
and hands each new record to a callback. A blocking ``read()`` on ``/dev/kmsg`` cannot be interrupted from another
thread, hence the poll; it also watches a pipe that ``stop()`` writes to, so it needs no short timeout to stop
promptly (an idle follower wakes every ``POLL_INTERVAL_S``, not five times a second). The thread never
touches the event loop: the daemon is never blocked, and a callback that raises is logged, not fatal.

A path that is a regular file (dmesg, ``journalctl -k`` or syslog output) is read as text lines,
one record per line, without sequence or timestamp; a followed file is re-read from its last offset.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from msgspec import Struct, field

from dgxdoctor import eventlog
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.follower import Follower

log = eventlog.get_logger(__name__)

# The kernel caps a record at 1 KiB of text plus metadata; 16 KiB is what util-linux dmesg reads with.
READ_SIZE = 16384
POLL_INTERVAL_S = 0.2  # a file's re-read, and the bound of a device's poll (with the stop pipe: DEVICE_POLL_S)
DEVICE_POLL_S = 30.0

# 6,1234,5678901234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
# 12,1301,97612345678,-,caller=T4242;NVRM: Xid (PCI:0000:3b:00): 13, ...   (extra fields after flags, 5.10+)
KMSG_HEADER_RE = lazy_compile(r"^(?P<prio>\d{1,20}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),(?P<flags>[^,;]*)(?:,[^;]*)?;")

# NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) installed ...   (an escaped newline)
KMSG_ESCAPE_RE = lazy_compile(r"\\x([0-9a-fA-F]{2})")


class KmsgFormatError(ValueError):
    """A record that is not ``prio,seq,usec,flags;message``."""


class KmsgRecord(Struct, frozen=True):
    """One kernel log record. ``seq`` and ``usec`` are None for lines read from a text log."""

    message: str
    facility: int | None = None
    level: int | None = None
    seq: int | None = None
    usec: int | None = None
    flags: str = "-"
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def lines(self) -> list[str]:
        """The message split at embedded newlines (multi-line printk output)."""
        return self.message.splitlines() or [""]


def parse_kmsg_record(raw: str) -> KmsgRecord:
    """Parse one ``/dev/kmsg`` record (header, message, and the space-indented KEY=value lines)."""
    first, _, rest = raw.partition("\n")
    match = KMSG_HEADER_RE.match(first)
    if match is None:
        raise KmsgFormatError(f"not a kmsg record (expected 'prio,seq,usec,flags;message'): {first[:80]!r}")
    prio = int(match["prio"])
    message = KMSG_ESCAPE_RE.sub(lambda m: chr(int(m[1], 16)), first[match.end() :])
    meta: dict[str, str] = {}
    for line in rest.splitlines():
        if line.startswith(" ") and "=" in line:
            key, _, value = line[1:].partition("=")
            meta[key] = value
    return KmsgRecord(
        message=message,
        facility=prio >> 3,
        level=prio & 7,
        seq=int(match["seq"]),
        usec=int(match["usec"]),
        flags=match["flags"],
        meta=meta,
    )


def text_records(text: str) -> Iterator[KmsgRecord]:
    """Lines of dmesg/journalctl/syslog text as records (one per non-empty line)."""
    for line in text.splitlines():
        if line.strip():
            yield KmsgRecord(message=line)


class ReadStats(Struct):
    """Counters since this reader was opened."""

    records: int = 0
    lost: int = 0
    # Sequence number of the oldest record the kernel still held at the first read (0: the buffer holds the boot).
    first_seq: int | None = None
    overruns: int = 0
    malformed: int = 0


class KmsgReader:
    """Reads what is new since the last call, never blocking.

    On ``/dev/kmsg`` (a character device) the first call returns the whole buffer since boot; on a
    text file, the whole file. Each later call returns only what arrived since.
    """

    def __init__(self, path: Path, read: Callable[[int, int], bytes] = os.read, device: bool | None = None) -> None:
        """``read`` and ``device`` are seams for tests (a fake ``read`` that raises EPIPE)."""
        self.path = path
        self.stats = ReadStats()
        self._read = read
        self._force_device = device
        self._fd: int | None = None
        self._is_device = False
        self._last_seq: int | None = None
        self._offset = 0
        self._partial = ""
        self._lock = threading.Lock()

    @property
    def is_device(self) -> bool:
        return self._is_device

    @property
    def last_seq(self) -> int | None:
        """Sequence number of the last record returned (device only)."""
        return self._last_seq

    def resume_after(self, seq: int) -> None:
        """Skip records up to ``seq`` (read before a restart); a gap after it is counted as lost."""
        with self._lock:
            self._last_seq = seq

    def open(self) -> None:
        """Open the path; raises FileNotFoundError/PermissionError for the caller to report."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        device = self._force_device
        self._is_device = stat.S_ISCHR(os.fstat(fd).st_mode) if device is None else device
        self._fd = fd

    def fileno(self) -> int:
        self.open()
        assert self._fd is not None
        return self._fd

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def read_available(self) -> list[KmsgRecord]:
        """Every record available now; returns at EAGAIN (device) or end of file (text)."""
        with self._lock:
            self.open()
            assert self._fd is not None
            return self._read_device(self._fd) if self._is_device else self._read_text(self._fd)

    def _read_device(self, fd: int) -> list[KmsgRecord]:
        out: list[KmsgRecord] = []
        while True:
            try:
                chunk = self._read(fd, READ_SIZE)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    # Records were overwritten before we read them; the gap in seq says how many.
                    self.stats.overruns += 1
                    continue
                if exc.errno == errno.EINVAL:
                    # A record larger than our buffer: cannot happen with 16 KiB, never loop on it.
                    self.stats.malformed += 1
                    return out
                raise
            if not chunk:
                return out
            try:
                record = parse_kmsg_record(chunk.decode("utf-8", errors="replace"))
            except KmsgFormatError:
                self.stats.malformed += 1
                continue
            if self.stats.first_seq is None:
                self.stats.first_seq = record.seq
            if self._last_seq is not None and record.seq is not None:
                if record.seq <= self._last_seq:
                    continue  # reopened: a new descriptor starts at the oldest record again
                if record.seq > self._last_seq + 1:
                    self.stats.lost += record.seq - self._last_seq - 1
            self._last_seq = record.seq
            self.stats.records += 1
            out.append(record)

    def _read_text(self, fd: int) -> list[KmsgRecord]:
        size = os.fstat(fd).st_size
        if size < self._offset:  # truncated or rotated: start over
            self._offset = 0
            self._partial = ""
        data = b""
        while True:
            chunk = os.pread(fd, 1 << 20, self._offset + len(data))
            if not chunk:
                break
            data += chunk
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        complete, _, self._partial = text.rpartition("\n")  # keep a line still being written
        records = list(text_records(complete))
        self.stats.records += len(records)
        return records


def records_since(records: Iterable[KmsgRecord], min_usec: int | None) -> list[KmsgRecord]:
    """Records at or after ``min_usec`` (records without a timestamp are always kept)."""
    if min_usec is None:
        return list(records)
    return [r for r in records if r.usec is None or r.usec >= min_usec]


class KmsgFollower(Follower[KmsgRecord]):
    """A daemon thread that delivers new records to ``callback`` as they arrive (see module doc)."""

    def __init__(
        self,
        reader: KmsgReader,
        callback: Callable[[list[KmsgRecord]], None],
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        super().__init__(
            f"kmsg-follow:{reader.path}",
            self._next,
            callback,
            lambda exc: f"reading {reader.path}: {exc}",
            "kmsg_follow",
        )
        self.reader = reader
        self.poll_interval_s = poll_interval_s
        self._poller: select.poll | None = None
        self._stop_pipe: tuple[int, int] | None = None  # (read, write): a byte written ends the poll at stop

    def start(self) -> None:
        if self.running:
            return
        self.reader.open()  # fail here, in the caller, if the path is missing or unreadable
        self._poller = None
        self._close_pipe()
        if self.reader.is_device:
            self._stop_pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._poller = select.poll()
            self._poller.register(self.reader.fileno(), select.POLLIN | select.POLLPRI)
            self._poller.register(self._stop_pipe[0], select.POLLIN)
        super().start()

    def interrupt(self) -> None:
        if self._stop_pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._stop_pipe[1], b"x")

    def stop(self, timeout_s: float = 2.0) -> None:
        super().stop(timeout_s)
        if not self.running:
            self._close_pipe()

    def _close_pipe(self) -> None:
        pipe, self._stop_pipe = self._stop_pipe, None
        for fd in pipe or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _next(self) -> list[KmsgRecord]:
        if self._poller is not None:
            self._poller.poll(DEVICE_POLL_S * 1000)
            if self.stopping:
                return []
        else:
            self.sleep(self.poll_interval_s)
        return self.reader.read_available()

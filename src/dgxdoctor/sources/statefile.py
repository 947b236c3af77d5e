"""Files that survive restarts and crashes: the one atomic writer and the one state-file class.

``atomic_writer`` is the only way dgxdoctor replaces a file (state files, the textfile, the bench baseline, a
bundle archive, the probe's kept output): temp file, fsync, rename, fsync the directory, so a crash leaves the old
or the new file, never half of one; and it raises every error. ``StateFile`` is a JSON object in such a file. A
check reads it leniently: an unreadable or corrupt file is reported and treated as empty (losing a baseline costs
one interval of rates, while refusing to start would cost all monitoring), and a failed write (disk full, read-only)
is logged, counted per file in ``WRITE_ERRORS`` (exported as ``dgxdoctor_write_errors_total{file}``) and does not
fail the check. Remediation reads and writes it strictly: an error stops the action.

The daemon runs as root: a file in ``state_dir`` is opened relative to the directory's descriptor and never through
a symbolic link (``O_NOFOLLOW``; a link planted there makes root write, append to or chmod what it points at), and
the temporary file's mode is set on its descriptor (``fchmod``), not by path. ``state_dir_problem`` is asked at
start: a directory another user owns or may write to is refused, since that user could plant links there at all.

A state file's format has a number, its ``version`` key, written on every save. Reading migrates an older format
step by step (``migrations``), never drops it: a file of the release before the formats were numbered has no key
(format 0, by default read as format 1, which added only the key). A newer format than this release knows (a node
rolled back) is read for the keys this release knows, and logged; each reader validates what it reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from dgxdoctor import eventlog

log = eventlog.get_logger(__name__)

# Failed writes per file name since the process started; every file written once has its series, at 0 at first.
WRITE_ERRORS: Counter[str] = Counter()


def note_file(name: str) -> None:
    """Make ``name``'s write-error series exist (at 0) before its first write."""
    WRITE_ERRORS.setdefault(name, 0)


def write_failed(name: str, path: Path, exc: OSError) -> None:
    WRITE_ERRORS[name] += 1
    log.warning("write_failed", file=name, path=str(path), error=str(exc), failures=WRITE_ERRORS[name])


def boot_id(proc_root: Path = Path("/proc")) -> str | None:
    """The kernel's boot id: a counter baseline from another boot is meaningless."""
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def state_dir_problem(path: Path, agent_uid: int | None = None) -> str | None:
    """Why ``path`` must not hold dgxdoctor's state, or None: not a directory, owned by a user other than root or
    the one dgxdoctor runs as, or writable by its group or others. An absent directory is fine (created 0750)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    me = os.geteuid() if agent_uid is None else agent_uid
    if st.st_uid not in (0, me):
        return f"{path} is owned by uid {st.st_uid}, not by root or uid {me} (dgxdoctor): that user could plant links"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o}): chmod go-w it"
    return None


def read_private_file(path: Path, max_bytes: int = 4096, agent_uid: int | None = None) -> str:
    """A secret kept in a file (the daemon's token): a regular file, not a symbolic link, owned by root or by the
    user dgxdoctor runs as, readable by nobody else (``chmod 0600``). ValueError naming what is wrong; OSError
    when it cannot be read at all."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link: name the file itself") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        me = os.geteuid() if agent_uid is None else agent_uid
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_uid not in (0, me):
            raise ValueError(f"{path} is owned by uid {st.st_uid}, not by root or uid {me} (dgxdoctor)")
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise ValueError(f"{path} is open to its group or others (mode {mode:04o}): chmod 0600 it")
        return fh.read(max_bytes + 1).decode("utf-8", errors="replace")


# st_mode -> what a file that is not regular is, for the error.
FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def open_regular_file(path: str | Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; OSError naming what it is otherwise. Opened without
    blocking first: ``open()`` of a FIFO waits for a writer forever (``diagnose`` hung on one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((kind for test, kind in FILE_KINDS if test(mode)), "not a regular file")
            raise OSError(errno.EINVAL, f"{what}, not a regular file (read a pipe or a device as - on stdin)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_dir(directory: Path) -> int:
    """A descriptor of ``directory`` to open its files relative to (the files themselves never through a link)."""
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_in(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """``name`` in the directory ``dir_fd``, never following a symbolic link (ELOOP when ``name`` is one)."""
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def read_in(directory: Path, name: str, max_bytes: int | None = None) -> bytes:
    """The whole of a regular file ``directory/name`` (its first ``max_bytes`` + 1 bytes when given, so a caller
    can tell it is too large); OSError (ELOOP for a link, FileNotFoundError) otherwise."""
    dir_fd = open_dir(directory)
    try:
        fd = open_in(dir_fd, name, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{directory / name} is not a regular file")
        return fh.read() if max_bytes is None else fh.read(max_bytes + 1)


@contextmanager
def atomic_writer(path: Path, mode: int = 0o600) -> Iterator[BinaryIO]:
    """The one atomic file writer: what is written to the yielded file goes to a temporary file in the same
    directory, fsynced, given ``mode``, renamed over ``path``; then the directory is fsynced. A reader (a scrape, a
    restart after a crash) sees the old file or the new one, never half. Every error is raised (the temporary file
    removed, ``path`` untouched); a caller that may go on without the file counts it (``write_failed``).

    ``mode`` is set explicitly: the daemon's umask (0027) must not decide who may read a shared file. Every step
    goes through descriptors: the temporary file is created exclusively, its mode set with ``fchmod``, and the
    rename replaces a link at ``path`` rather than writing through it."""
    dir_fd = open_dir(path.parent)
    try:
        tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = open_in(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``data`` as the whole of ``path``, through ``atomic_writer``; raises what the file system refused."""
    with atomic_writer(path, mode) as fh:
        fh.write(data)


# A state file is a few KiB (every collection in one is bounded); this bounds the read itself.
MAX_STATE_BYTES = 1 << 20
# The format of a file written before state files carried a ``version`` (the release at 85f803c: the logs offsets
# and the bench's last run; its xid, infiniband and remediation files already said version 1).
UNVERSIONED = 0
# One step of a format's migration: the document of format n made the document of format n + 1.
Migration = Callable[[dict[str, Any]], dict[str, Any]]


def same_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """The migration of a format numbered without other change."""
    return doc


class StateFile:
    """One JSON object in one file of the state directory: counter baselines, log offsets, the remediation guard.

    Two ways to read and to write, one for each kind of reader: ``read``/``write`` raise (remediation must never
    act on a state it could not read or save), ``load``/``save`` carry on (a check loses one interval of rates
    rather than all monitoring): ``load`` reports and gives {}, ``save`` logs, counts and answers False.
    ``locked`` holds an exclusive lock on ``lock_path`` (``dgxdoctor remediation reset`` and the daemon).
    """

    def __init__(
        self,
        path: Path,
        *,
        lock_path: Path | None = None,
        mode: int = 0o600,
        indent: int | None = None,
        max_bytes: int = MAX_STATE_BYTES,
        version: int = 1,
        migrations: Mapping[int, Migration] | None = None,
    ) -> None:
        """``version``: the format this release writes; ``migrations[n]`` makes format n's document format n + 1's
        (format 0, the unnumbered one, is format 1 without its key unless a migration says otherwise)."""
        self.path = path
        self.lock_path = lock_path
        self.mode = mode
        self.indent = indent
        self.max_bytes = max_bytes
        self.version = version
        self.migrations: dict[int, Migration] = {UNVERSIONED: same_keys, **(migrations or {})}
        note_file(path.name)

    def read(self) -> dict[str, Any]:
        """The saved object; {} when there is none. OSError when it cannot be read (a link, a directory, no
        permission), ValueError naming what is wrong with its content (never silently reset)."""
        try:
            raw = read_in(self.path.parent, self.path.name, self.max_bytes)
        except FileNotFoundError:
            return {}
        if len(raw) > self.max_bytes:
            raise ValueError(f"{self.path}: larger than {self.max_bytes} bytes (dgxdoctor writes a few KiB)")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise ValueError(f"{self.path}: nested too deeply") from None
        except ValueError as exc:  # not UTF-8, not JSON
            raise ValueError(f"{self.path}: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path}: not a JSON object")
        return self.migrated(doc)

    def migrated(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` in this release's format (its ``version`` set); a newer format as it is, for the keys this release
        knows. ValueError for a ``version`` that is no format number."""
        found = doc.get("version", UNVERSIONED)
        if not isinstance(found, int) or isinstance(found, bool) or found < 0:
            raise ValueError(f"{self.path}: 'version' {str(found)[:40]!r} is not a format number")
        if found > self.version:
            log.info("state_newer_format", path=str(self.path), version=found, known=self.version)
            return doc
        while found < self.version:
            step = self.migrations.get(found)
            if step is None:
                raise ValueError(f"{self.path}: no migration from format {found} to {self.version}")
            doc = {**step(doc), "version": found + 1}
            found += 1
        return doc

    def load(self) -> dict[str, Any]:
        """``read``, but an unreadable or corrupt file is logged and read as {}."""
        try:
            return self.read()
        except OSError as exc:
            log.warning("state_unreadable", path=str(self.path), error=str(exc))
        except ValueError as exc:
            log.warning("state_corrupt", path=str(self.path), error=str(exc))
        return {}

    def write(self, doc: dict[str, Any]) -> None:
        """Replace the file atomically (``atomic_writer``), its ``version`` this release's format; raises what the
        file system refused."""
        self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        separators = (",", ":") if self.indent is None else None
        text = json.dumps({**doc, "version": self.version}, separators=separators, indent=self.indent, sort_keys=True)
        atomic_write(self.path, text.encode("utf-8"), self.mode)

    def save(self, doc: dict[str, Any]) -> bool:
        """``write``; False (logged and counted in ``WRITE_ERRORS``) when the write failed."""
        try:
            self.write(doc)
        except OSError as exc:
            write_failed(self.path.name, self.path, exc)
            return False
        return True

    @contextmanager
    def locked(self) -> Iterator[None]:
        if self.lock_path is None:
            raise ValueError(f"{self.path} is written without a lock")
        self.lock_path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        dir_fd = open_dir(self.lock_path.parent)
        try:
            fd = open_in(dir_fd, self.lock_path.name, os.O_RDWR | os.O_CREAT, 0o640)
        finally:
            os.close(dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def set_aside(self, now: float) -> Path:
        """Rename an invalid file out of the way (kept for the operator); its new path. Call it under the lock."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        kept = self.path.with_name(f"{self.path.name}.invalid-{stamp}")
        n = 1
        while kept.exists():
            kept = self.path.with_name(f"{self.path.name}.invalid-{stamp}.{n}")
            n += 1
        os.replace(self.path, kept)
        return kept

"""A model directory's fingerprint: what the tutorial's step 5 checks by hand on both nodes.

``ls -l /models/glm | md5sum`` on each node becomes ``listing_fingerprint``: sha256 over the sorted relative file
names and sizes (first 16 hex digits). ``sha256sum`` of a few shards becomes ``ShardHasher``: the full sha256 of a
deterministic sample of ``*.safetensors`` files, computed a bounded number of bytes per call so that a check run
never reads hundreds of GB at once.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from msgspec import Struct, field

SHARD_SUFFIX = ".safetensors"
READ_CHUNK = 4 * 1024 * 1024


class Entry(Struct, frozen=True):
    name: str  # relative to the model directory, "/" separated
    size: int


def scan_model_dir(root: Path) -> list[Entry]:
    """Every regular file under ``root`` (symlinks followed, as the Hugging Face cache uses them), sorted.

    Each real directory is listed once: a directory symlink back up the tree (``sub/up -> ..``) would otherwise
    make the walk endless (two such links: 2^40 paths before the kernel's ELOOP stops it)."""
    entries: list[Entry] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in filenames:
            if filename.startswith("."):
                continue  # .cache/, .lock files of the hub client differ between nodes without meaning anything
            full = Path(dirpath) / filename
            try:
                st = full.stat()
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # a FIFO or device named *.safetensors would block or never end the shard hashing
            entries.append(Entry(full.relative_to(root).as_posix(), st.st_size))
    return sorted(entries, key=lambda e: e.name)


def listing_fingerprint(entries: Iterable[Entry]) -> str:
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.name):
        digest.update(f"{entry.name}\0{entry.size}\n".encode())
    return digest.hexdigest()[:16]


def sample_shards(entries: Sequence[Entry], count: int) -> list[Entry]:
    """``count`` shards chosen the same way on every node: first and last by name, then evenly between."""
    shards = sorted((e for e in entries if e.name.endswith(SHARD_SUFFIX)), key=lambda e: e.name)
    if count <= 0 or not shards:
        return []
    if count >= len(shards):
        return shards
    if count == 1:
        return [shards[0]]
    step = (len(shards) - 1) / (count - 1)
    picked = sorted({round(i * step) for i in range(count)})
    return [shards[i] for i in picked]


class _Progress(Struct):
    size: int
    mtime_ns: int
    offset: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    done: str | None = None


class ShardHasher:
    """Full sha256 of files, advanced at most ``budget`` bytes per ``advance`` call; resumes where it stopped.

    A file whose size or mtime changes is hashed again from the start.
    """

    def __init__(self) -> None:
        self._progress: dict[str, _Progress] = {}

    def advance(self, paths: Sequence[Path], budget: int) -> dict[str, str | None]:
        """Hex digest per path, or None while not finished (or unreadable)."""
        out: dict[str, str | None] = {}
        for path in paths:
            key = str(path)
            try:
                st = path.stat()
            except OSError:
                self._progress.pop(key, None)
                out[key] = None
                continue
            prog = self._progress.get(key)
            if prog is None or (prog.size, prog.mtime_ns) != (st.st_size, st.st_mtime_ns):
                prog = self._progress[key] = _Progress(st.st_size, st.st_mtime_ns)
            if prog.done is None and budget > 0:
                budget -= self._read(path, prog, budget)
            out[key] = prog.done
        for key in set(self._progress) - {str(p) for p in paths}:
            del self._progress[key]
        return out

    @staticmethod
    def _read(path: Path, prog: _Progress, budget: int) -> int:
        used = 0
        try:
            with path.open("rb") as fh:
                fh.seek(prog.offset)
                while used < budget:
                    chunk = fh.read(min(READ_CHUNK, budget - used))
                    if not chunk:
                        prog.done = prog.digest.hexdigest()
                        break
                    prog.digest.update(chunk)
                    prog.offset += len(chunk)
                    used += len(chunk)
                if prog.offset >= prog.size and prog.done is None:
                    prog.done = prog.digest.hexdigest()
        except OSError:
            return used
        return used

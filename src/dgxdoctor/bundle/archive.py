"""The bundle on disk: one ``.tar.gz``, a folder per node with its files and manifest, a manifest at the top.

Written to a temporary file beside the target and renamed into place, so a reader never sees half an archive.
A part that came from a peer is read back from its own archive here with every name and size checked: a peer's
answer is untrusted (no absolute paths, no ``..``, regular files only, bounded bytes).
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dgxdoctor.bundle.collect import Part
from dgxdoctor.sources.statefile import atomic_writer

# results.json, logs/ray/raylet.out.log, nvidia-smi-q.txt
SAFE_NAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}(?:/[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}){0,3}\Z")
MAX_MEMBERS = 500


class BadPart(ValueError):
    """A peer's part archive that is not what this agent writes."""


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o640
    tar.addfile(info, io.BytesIO(data))


def part_bytes(part: Part) -> bytes:
    """One node's part as a tar.gz of its own (what ``POST /bundle/part`` answers)."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in part.files:
            _add(tar, name, data, now)
        _add(tar, "manifest.json", json.dumps(part.manifest, indent=1).encode(), now)
    return buf.getvalue()


def read_part(raw: bytes, max_bytes: int) -> Part:
    """A peer's part archive back into a Part; BadPart naming what is wrong."""
    part = Part("")
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            for i, member in enumerate(tar):
                if i >= MAX_MEMBERS:
                    raise BadPart(f"more than {MAX_MEMBERS} files")
                if not member.isreg() or not SAFE_NAME.match(member.name) or ".." in member.name:
                    raise BadPart(f"unexpected member {member.name[:80]!r}")
                total += member.size
                if total > max_bytes:
                    raise BadPart(f"more than {max_bytes} bytes")
                fh = tar.extractfile(member)
                data = fh.read(member.size) if fh else b""
                if member.name == "manifest.json":
                    part.manifest = _manifest(data)
                else:
                    part.files.append((member.name, data))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BadPart(f"not a tar.gz ({exc})") from None
    part.node = str(part.manifest.get("node", ""))[:253]
    return part


def _manifest(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise BadPart("manifest.json is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise BadPart("manifest.json has no file list")
    return doc


def write_bundle(path: Path, parts: Sequence[Part], top: dict[str, Any]) -> int:
    """The archive at ``path`` (``atomic_writer``: all of it or nothing, errors raised); returns its size in bytes."""
    stem = path.name.removesuffix(".tar.gz")
    now = time.time()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path, 0o600) as fh, tarfile.open(fileobj=fh, mode="w:gz") as tar:
        _add(tar, f"{stem}/manifest.json", json.dumps(top, indent=1).encode(), now)
        for part in parts:
            folder = f"{stem}/{part.node}"
            _add(tar, f"{folder}/manifest.json", json.dumps(part.manifest, indent=1).encode(), now)
            for name, data in part.files:
                _add(tar, f"{folder}/{name}", data, now)
    return path.stat().st_size


def prune(folder: Path, keep: int, pattern: str = "*.tar.gz") -> list[Path]:
    """Remove all but the newest ``keep`` archives in ``folder``; returns those removed."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in found[keep:]:
        try:
            old.unlink()
            removed.append(old)
        except OSError:
            continue
    return removed

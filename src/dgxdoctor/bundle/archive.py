"""The bundle on disk: one ``.tar.gz``, a folder per node with its files and manifest, a manifest at the top.

Written to a temporary file beside the target and renamed into place, so a reader never sees half an archive.
A part that came from a peer is read back from its own archive here with every name and size checked: a peer's
answer is untrusted (no absolute paths, no ``..``, regular files only, bounded bytes: decompressed within a bound,
and every header's claimed size checked before ``tarfile`` reads it).
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dgxdoctor.bundle.collect import Part
from dgxdoctor.sources.statefile import atomic_writer

# results.json, logs/ray/raylet.out.log, nvidia-smi-q.txt
SAFE_NAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}(?:/[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}){0,3}\Z")
MAX_MEMBERS = 500
BLOCK = tarfile.BLOCKSIZE
# pax extended headers (per member, global) and GNU long names (of a member, of a link target): this agent writes
# only short names (SAFE_NAME); a few KiB is room for any pax record a tar library adds.
EXTENDED = frozenset({tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK})
MAX_EXTENDED_BYTES = 8192


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


def gunzipped(raw: bytes, max_bytes: int) -> bytes:
    """The tar inside a peer's ``.tar.gz``, decompressed up to ``max_bytes`` and refused past it: a small gzip can
    claim gigabytes (zeros compress a thousandfold), and what it holds is known only by decompressing."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
    try:
        out = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise BadPart(f"not a tar.gz ({exc})") from None
    if len(out) > max_bytes:
        raise BadPart(f"more than {max_bytes} bytes uncompressed")
    if not inflater.eof:
        raise BadPart("not a tar.gz (truncated)")
    return out


def bounded_headers(tar: bytes, max_members: int = MAX_MEMBERS) -> None:
    """Walk the tar's 512-byte headers before ``tarfile`` reads any: every member's claimed size within what is
    there, a pax (``x``, ``g``) or GNU long-name (``L``, ``K``) header within ``MAX_EXTENDED_BYTES`` (tarfile would
    read a claimed gigabyte of one into memory), at most ``max_members`` headers. BadPart naming the first bad one."""
    offset, count = 0, 0
    while offset + BLOCK <= len(tar):
        header = tar[offset : offset + BLOCK]
        if header == bytes(BLOCK):  # the end-of-archive blocks
            return
        count += 1
        if count > 2 * max_members:  # a member may come with one extended header
            raise BadPart(f"more than {max_members} files")
        kind = header[156:157]
        size = _size_field(header[124:136], offset)
        if kind in EXTENDED and size > MAX_EXTENDED_BYTES:
            raise BadPart(f"extended header ({kind.decode('ascii', 'replace')!r}) of {size} bytes")
        if size < 0 or offset + BLOCK + size > len(tar):
            raise BadPart(f"member at byte {offset} claims {size} bytes, more than the archive holds")
        offset += BLOCK + -(-size // BLOCK) * BLOCK


def _size_field(field: bytes, offset: int) -> int:
    """A header's size: octal digits, or base-256 when the first byte's top bit is set (GNU, for sizes past 8 GiB)."""
    if field[0] & 0x80:
        return -1 if field[0] == 0xFF else int.from_bytes(field[1:], "big")
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise BadPart(f"unreadable tar header at byte {offset}") from None


def read_part(raw: bytes, max_bytes: int) -> Part:
    """A peer's part archive back into a Part; BadPart naming what is wrong. Decompressed within a bound and its
    headers checked (``bounded_headers``) before ``tarfile`` reads a member."""
    part = Part("")
    total = 0
    tar_bytes = gunzipped(raw, max_bytes + MAX_MEMBERS * 2 * (BLOCK + MAX_EXTENDED_BYTES) + 2 * 10 * BLOCK)
    bounded_headers(tar_bytes)
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
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

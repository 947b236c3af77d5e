"""Processes, read through a procfs root so tests can lay out a fake /proc tree (proc(5))."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcEntry:
    pid: int
    comm: str
    cmdline: tuple[str, ...]


def iter_processes(proc_root: Path) -> Iterator[ProcEntry]:
    """Processes under a procfs root: /proc/<pid>/comm and /proc/<pid>/cmdline (NUL-separated)."""
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        comm = _read_text(entry / "comm")
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            raw = b""
        args = tuple(a.decode("utf-8", errors="replace") for a in raw.split(b"\0") if a)
        yield ProcEntry(int(entry.name), comm, args)


def command_matches(wanted: str, comm: str, cmdline: tuple[str, ...]) -> bool:
    """``raylet`` matches comm raylet or argv[0] .../raylet; ``vllm`` matches ``vllm serve`` and
    ``python -m vllm.entrypoints.openai.api_server`` (comm is python or vllm). comm is cut at 15 chars."""
    if comm == wanted or (len(comm) == 15 and wanted.startswith(comm)):
        return True
    for arg in cmdline[:3]:
        base = arg.rsplit("/", 1)[-1]
        if base == wanted or base.startswith(wanted + "."):
            return True
    return False


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""

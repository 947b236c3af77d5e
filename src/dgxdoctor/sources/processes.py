"""Processes, read through a procfs root so tests can lay out a fake /proc tree (proc(5))."""

from __future__ import annotations

import re
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


# "/usr/bin/python3.11", "python": an interpreter running a script or module named on its command line.
PYTHON_RE = re.compile(r"^python[0-9.]*$")


def command_matches(wanted: str, comm: str, cmdline: tuple[str, ...]) -> bool:
    """``raylet`` matches comm raylet or argv[0] .../raylet; ``vllm`` also matches ``python .../vllm serve``
    and ``python -m vllm.entrypoints.openai.api_server`` (comm python). comm is cut at 15 characters.
    Arguments in general do not count: ``tail -f .../raylet.out`` is not raylet."""
    if comm == wanted or (len(comm) == 15 and wanted.startswith(comm)):
        return True
    if not cmdline:
        return False
    if _base(cmdline[0]) == wanted:
        return True
    if not PYTHON_RE.match(_base(cmdline[0])):
        return False
    args = [a for a in cmdline[1:] if a not in ("-u", "-O", "-B", "-E", "-s", "-I")]
    if len(args) >= 2 and args[0] == "-m":
        return args[1] == wanted or args[1].startswith(wanted + ".")
    return bool(args) and _base(args[0]) == wanted


def _base(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""

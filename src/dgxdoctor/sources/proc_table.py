"""Processes from procfs (``/proc/<pid>/cmdline`` and ``/proc/<pid>/stat``), under an injectable proc root.

Read directly rather than through psutil so that a test can lay out a proc tree (psutil reads the real ``/proc``).
Formats: proc(5) — ``/proc/[pid]/stat`` fields 3 (state), 14/15 (utime/stime, clock ticks) and 22 (starttime,
clock ticks after boot); ``/proc/stat`` line ``btime`` (boot time, seconds since the epoch).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Clock ticks per second for the stat fields (sysconf(_SC_CLK_TCK); 100 on every Linux this runs on).
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# /proc/stat, from a Debian 12 host:
# btime 1796003545
BTIME_RE = re.compile(r"^btime\s+(\d+)\s*$", re.MULTILINE)

# /proc/<pid>/stat of a vLLM engine process (the comm may itself contain spaces and parentheses, so the fields are
# taken after the LAST ')'):
# 7573 (VLLM::EngineCor) S 7538 7538 7538 0 -1 4194304 163112 488 0 0 644 105 0 0 20 0 15 0 177676 2451329024 ...
STAT_RE = re.compile(r"^(\d+) \((.*)\) (.*)$", re.DOTALL)


@dataclass(frozen=True)
class ProcStat:
    state: str  # R running, S sleeping, D disk sleep, T stopped, t traced, Z zombie
    cpu_ticks: int  # utime + stime
    start_ticks: int  # after boot


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    cmdline: tuple[str, ...]
    stat: ProcStat
    start_time: float | None  # seconds since the epoch; None when btime is unreadable


class ProcFormatError(ValueError):
    pass


def parse_proc_stat(text: str) -> ProcStat:
    """``/proc/<pid>/stat`` -> state, CPU ticks and start time. Raises ProcFormatError on a malformed line."""
    m = STAT_RE.match(text.strip())
    if m is None:
        raise ProcFormatError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    rest = m.group(3).split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    if len(rest) < 20:
        raise ProcFormatError(f"/proc/<pid>/stat has {len(rest) + 2} fields, expected at least 22")
    try:
        return ProcStat(state=rest[0], cpu_ticks=int(rest[11]) + int(rest[12]), start_ticks=int(rest[19]))
    except ValueError:
        raise ProcFormatError(f"non-numeric field in /proc/<pid>/stat: {text[:80]!r}") from None


def parse_btime(text: str) -> float | None:
    m = BTIME_RE.search(text)
    return float(m.group(1)) if m else None


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """NUL-separated argv. A process that rewrote its title (setproctitle) may use spaces instead."""
    parts = raw.rstrip(b"\0").split(b"\0")
    argv = tuple(p.decode("utf-8", errors="replace") for p in parts if p)
    return argv


def read_btime(proc_root: Path) -> float | None:
    try:
        return parse_btime((proc_root / "stat").read_text(errors="replace"))
    except OSError:
        return None


def read_process(proc_root: Path, pid: int, btime: float | None = None) -> ProcInfo | None:
    """One process; None when it is gone (or is a kernel thread with no cmdline)."""
    base = proc_root / str(pid)
    try:
        cmdline = parse_cmdline((base / "cmdline").read_bytes())
        stat = parse_proc_stat((base / "stat").read_text(errors="replace"))
    except (OSError, ProcFormatError):
        return None
    if not cmdline:
        return None
    if btime is None:
        btime = read_btime(proc_root)
    start = None if btime is None else btime + stat.start_ticks / CLK_TCK
    return ProcInfo(pid, cmdline, stat, start)


def iter_processes(proc_root: Path) -> Iterator[ProcInfo]:
    """Every user-space process under ``proc_root`` (processes that vanish while listed are skipped)."""
    btime = read_btime(proc_root)
    try:
        entries = list(os.scandir(proc_root))
    except OSError:
        return
    for entry in entries:
        if entry.name.isdigit():
            info = read_process(proc_root, int(entry.name), btime)
            if info is not None:
                yield info

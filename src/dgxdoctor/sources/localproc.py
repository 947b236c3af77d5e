"""Local processes and listening TCP ports, read from procfs (``proc_root``) so tests can lay out a copy.

- ``/proc/<pid>/comm``: the process name, truncated by the kernel to 15 characters (``raylet``, ``gcs_server``).
- ``/proc/<pid>/stat``: field 3 is the state letter (``Z`` zombie, ``X`` dead); see proc(5).
- ``/proc/<pid>/ns/net``: a link naming the process's network namespace (``net:[4026531840]``).
- ``/proc/net/tcp`` and ``/proc/net/tcp6``: one socket per line, local address as hex ``ADDR:PORT``, state
  ``0A`` is TCP_LISTEN (include/net/tcp_states.h). They show the network namespace of the reader.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"

#    5: 00000000:2049 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12267 1 ...
#    2: 00000000000000000000000000000000:18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 ...
PROC_NET_TCP_RE = re.compile(
    r"^\s*\d+:\s+(?P<local_addr>[0-9A-Fa-f]+):(?P<local_port>[0-9A-Fa-f]{4})\s+"
    r"[0-9A-Fa-f]+:[0-9A-Fa-f]{4}\s+(?P<state>[0-9A-Fa-f]{2})\s"
)
# 8109 (raylet) S 8105 8105 ...   (the name may hold spaces and parentheses: take the last ")")
PROC_STAT_STATE_RE = re.compile(r"\)\s+(?P<state>[A-Za-z])\s")


@dataclass(frozen=True)
class Socket:
    local_addr: str
    port: int
    state: str


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    state: str  # R, S, D, Z, ...; "?" when unreadable

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def parse_proc_net_tcp(text: str) -> list[Socket]:
    """Sockets of one ``/proc/net/tcp`` or ``tcp6`` file; the header and unknown lines are skipped."""
    sockets = []
    for line in text.splitlines()[1:]:
        m = PROC_NET_TCP_RE.match(line)
        if m:
            sockets.append(Socket(m.group("local_addr"), int(m.group("local_port"), 16), m.group("state").upper()))
    return sockets


def listening_ports(proc_root: Path) -> set[int] | None:
    """TCP ports in LISTEN state in this network namespace, IPv4 and IPv6; None when neither file is readable."""
    ports: set[int] = set()
    read_any = False
    for name in ("tcp", "tcp6"):
        try:
            text = (proc_root / "net" / name).read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        read_any = True
        ports.update(s.port for s in parse_proc_net_tcp(text) if s.state == TCP_LISTEN)
    return ports if read_any else None


def parse_stat_state(text: str) -> str:
    """The state letter of ``/proc/<pid>/stat``; "?" when the line is not understood."""
    m = PROC_STAT_STATE_RE.match(text[text.rfind(")") :]) if ")" in text else None
    return m.group("state") if m else "?"


def _net_ns(proc_dir: Path) -> str | None:
    try:
        return str((proc_dir / "ns" / "net").readlink())
    except OSError:
        return None


def find_processes(proc_root: Path, names: Iterable[str]) -> list[Process]:
    """Processes whose ``comm`` is one of ``names``, in this network namespace when that can be told.

    A raylet in another network namespace belongs to another node (containers, or namespaces used as nodes)
    and serves other addresses. Processes that exit while we look are skipped.
    """
    wanted = set(names)
    own_ns = _net_ns(proc_root / "self")
    found = []
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if name not in wanted:
            continue
        if own_ns is not None and _net_ns(entry) not in (own_ns, None):
            continue
        try:
            state = parse_stat_state((entry / "stat").read_text(encoding="utf-8", errors="replace"))
        except OSError:
            state = "?"
        found.append(Process(int(entry.name), name, state))
    return sorted(found, key=lambda p: p.pid)

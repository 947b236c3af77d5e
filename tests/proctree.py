"""Lay out a procfs tree (proc(5)) under a test directory, for checks that read ``env.proc_root``.

The stat line has the shape of a real one (``cat /proc/self/stat`` on a Debian 12 host, cut after the 24th field):
``28342 (cat) R 28338 28338 25932 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 377793 3133440 390``
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def stat_line(
    pid: int, comm: str, state: str = "S", utime: int = 0, stime: int = 0, start_ticks: int = 100, ppid: int = 1
) -> str:
    return (
        f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194304 100 0 0 0 {utime} {stime} 0 0 20 0 1 0 "
        f"{start_ticks} 3133440 390\n"
    )


def write_process(
    root: Path,
    pid: int,
    comm: str,
    cmdline: Sequence[str] = (),
    *,
    state: str = "S",
    uid: int | None = None,
    exe: str | None = None,
    netns: str | None = None,
    utime: int = 0,
    stime: int = 0,
    start_ticks: int = 100,
    ppid: int = 1,
) -> Path:
    """``<root>/<pid>/{comm,cmdline,stat,status}``, ``exe`` and ``ns/net`` links when given; uid defaults to
    the test's own (a trusted process)."""
    d = root / str(pid)
    (d / "ns").mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))
    (d / "stat").write_text(stat_line(pid, comm, state, utime, stime, start_ticks, ppid))
    owner = os.geteuid() if uid is None else uid
    (d / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\t{state}\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t{ppid}\n"
        f"Uid:\t{owner}\t{owner}\t{owner}\t{owner}\nGid:\t{owner}\t{owner}\t{owner}\t{owner}\n"
    )
    if exe is not None:
        (d / "exe").symlink_to(exe)
    if netns is not None:
        (d / "ns" / "net").symlink_to(netns)
    return d


# /proc/net/tcp of the development host: the header and a listening socket (``python3 -m http.server``), its
# uid (0) and inode (13024) in the columns the kernel prints them (net/ipv4/tcp_ipv4.c, get_tcp4_sock).
TCP_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
    "                                                     \n"
)


def tcp_listen_line(slot: int, port: int, uid: int, inode: int, addr: str = "0100007F") -> str:
    return (
        f"{slot:4d}: {addr}:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {uid:5d}        0 "
        f"{inode} 1 00000000479e60e3 100 0 0 10 0                     \n"
    )


def listen(root: Path, pid: int, port: int, inode: int = 13024, uid: int | None = None, fd: int = 13) -> None:
    """Process ``pid`` listens on 127.0.0.1:``port``: a line of ``<root>/net/tcp`` and its ``fd/<fd>`` link
    ``socket:[inode]``, as ``ss -ltnp`` reads them."""
    net = root / "net"
    net.mkdir(parents=True, exist_ok=True)
    tcp = net / "tcp"
    lines = tcp.read_text() if tcp.exists() else TCP_HEADER
    slot = lines.count("\n") - 1
    tcp.write_text(lines + tcp_listen_line(slot, port, os.geteuid() if uid is None else uid, inode))
    fds = root / str(pid) / "fd"
    fds.mkdir(parents=True, exist_ok=True)
    (fds / str(fd)).symlink_to(f"socket:[{inode}]")

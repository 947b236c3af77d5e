"""Processes and listening TCP ports, read from procfs under an injectable root (``env.proc_root``).

The one way dgxdoctor reads the process table: every check that looks for a process (host, nccl_env, vllm, ray,
drift, nccl) goes through ``iter_processes``/``read_process`` here, so a test can lay out a proc tree under
``tmp_path`` (psutil always reads the real ``/proc``).

A ``ProcessInfo`` knows only its pid up front; each other field reads its file the first time it is asked for
and keeps the value. Listing a busy host therefore costs one ``scandir`` plus the files the caller actually
looks at (``benchmarks/procfs_scan.py`` prints the figures). Fields are snapshots taken one at a time: a process
that exits between two reads leaves the later fields empty (``""``, ``()``, ``None``, state ``"?"``).

Formats, all from proc(5):

- ``/proc/<pid>/comm``: the name, cut by the kernel at 15 characters (``raylet``, ``gcs_server``).
- ``/proc/<pid>/cmdline``: argv, NUL-separated; empty for kernel threads and zombies.
- ``/proc/<pid>/exe``: a link to the executable (``/usr/bin/python3.11``); unreadable for another user's
  processes unless root, and for kernel threads.
- ``/proc/<pid>/status``: the ``Uid:`` line (real, effective, saved, filesystem uid).
- ``/proc/<pid>/stat``: field 3 state, 14/15 utime/stime and 22 starttime (clock ticks after boot).
- ``/proc/stat``: ``btime``, the boot time in seconds since the epoch.
- ``/proc/<pid>/ns/net``: a link naming the network namespace (``net:[4026531840]``).
- ``/proc/net/tcp`` and ``/proc/net/tcp6``: one socket per line, local address as hex ``ADDR:PORT``; state ``0A``
  is TCP_LISTEN (include/net/tcp_states.h); then the owner's uid and the socket's inode. They show the network
  namespace of the reader.
- ``/proc/<pid>/fd/<n>``: a link per open file; a socket reads ``socket:[<inode>]``, the inode of ``/proc/net/tcp``.
  Who listens on a port is the process holding that inode (what ``ss -ltnp`` prints): the only owner an
  unprivileged user cannot forge, unlike a command line (``exec -a VLLM::EngineCore sleep 300``) or a title.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile

# Clock ticks per second for the stat fields (sysconf(_SC_CLK_TCK); 100 on every Linux this runs on).
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# /proc/stat, from a Debian 12 host:
# btime 1796003545
BTIME_RE = lazy_compile(r"^btime\s+(\d+)\s*$", re.MULTILINE)

# /proc/<pid>/stat of a vLLM engine process, whose parent (field 4) is the API server 7538 (the comm may itself
# contain spaces and parentheses, so the fields are taken after the LAST ')'):
# 7573 (VLLM::EngineCor) S 7538 7538 7538 0 -1 4194304 163112 488 0 0 644 105 0 0 20 0 15 0 177676 2451329024 ...
STAT_RE = lazy_compile(r"^(\d+) \((.*)\) (.*)$", re.DOTALL)

# /proc/<pid>/status, the uid line (real, effective, saved set, filesystem; tab-separated), of a root shell on the
# development host (kernel 6.x):
# Uid:	0	0	0	0
STATUS_UID_RE = lazy_compile(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", re.MULTILINE)

# readlink /proc/<pid>/ns/net on the development host (4026531840 is the usual inode of the initial namespace):
# net:[4026531833]
NETNS_LINK_RE = lazy_compile(r"^net:\[(\d+)\]$")

# /proc/net/tcp and /proc/net/tcp6 of a Ray head (tests/fixtures/ray/head-proc-net-tcp*.txt):
#    5: 00000000:2049 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12267 1 ...
#    2: 00000000000000000000000000000000:18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 ...
# after the state: tx:rx queues, timer, retransmits, then uid, timeout and inode (``0        0 12267``); uid and
# inode bounded (32 and 64 bits), so another writer's absurd digits never reach int().
PROC_NET_TCP_RE = lazy_compile(
    r"^\s*\d+:\s+(?P<local_addr>[0-9A-Fa-f]+):(?P<local_port>[0-9A-Fa-f]{4})\s+"
    r"[0-9A-Fa-f]+:[0-9A-Fa-f]{4}\s+(?P<state>[0-9A-Fa-f]{2})\s"
    r"(?:\s*[0-9A-Fa-f]+:[0-9A-Fa-f]+\s+[0-9A-Fa-f]+:[0-9A-Fa-f]+\s+[0-9A-Fa-f]+\s+(?P<uid>\d{1,10})\s+\d+\s+(?P<inode>\d{1,20})\b)?"
)
# readlink /proc/<pid>/fd/3 of a listening Python process on the development host:
# socket:[13024]
SOCKET_LINK_RE = lazy_compile(r"^socket:\[(\d+)\]$")
TCP_LISTEN = "0A"

# "/usr/bin/python3.11", "python": an interpreter running a script or module named on its command line.
PYTHON_RE = lazy_compile(r"^python[0-9.]*$")
# Interpreter flags that may stand between ``python`` and ``-m module`` or the script.
PYTHON_FLAGS = ("-u", "-O", "-B", "-E", "-s", "-I")

DEAD_STATES = ("Z", "X", "x")  # zombie, dead (the kernel has used both letters for dead)
DELETED_SUFFIX = " (deleted)"  # readlink of an exe whose file was replaced or removed


class ProcFormatError(ValueError):
    pass


class ProcStat(Struct, frozen=True):
    state: str  # R running, S sleeping, D disk sleep, T stopped, t traced, Z zombie
    ppid: int  # the parent's pid (field 4)
    utime: int  # clock ticks in user mode
    stime: int  # clock ticks in kernel mode
    start_ticks: int  # after boot

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime


class Socket(Struct, frozen=True):
    local_addr: str
    port: int
    state: str
    uid: int | None = None  # the owner (None on a line cut before it)
    inode: int | None = None


# ----- pure parsers ------------------------------------------------------------------------------------------


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
        return ProcStat(
            state=rest[0], ppid=int(rest[1]), utime=int(rest[11]), stime=int(rest[12]), start_ticks=int(rest[19])
        )
    except ValueError:
        raise ProcFormatError(f"non-numeric field in /proc/<pid>/stat: {text[:80]!r}") from None


# /proc/meminfo (proc(5)), values in KiB but for the HugePages_* counts:
#   MemTotal:       24683584 kB
#   MemAvailable:   21250108 kB
MEMINFO_RE = lazy_compile(r"^(?P<key>[A-Za-z0-9_()]+):\s+(?P<value>\d+)(?: kB)?$", re.MULTILINE)


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per field (``kB`` fields times 1024)."""
    return {m["key"]: int(m["value"]) * (1024 if m[0].endswith("kB") else 1) for m in MEMINFO_RE.finditer(text)}


def parse_btime(text: str) -> float | None:
    m = BTIME_RE.search(text)
    return float(m.group(1)) if m else None


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """NUL-separated argv. A process that rewrote its title (setproctitle) may pad it with NULs, or put its
    arguments in one string separated by spaces, which is split on the spaces (what psutil and ps do)."""
    if not raw:
        return ()
    parts = [p for p in raw.rstrip(b"\0").split(b"\0") if p]
    if len(parts) == 1 and b" " in parts[0]:
        parts = [p for p in parts[0].split(b" ") if p]
    return tuple(p.decode("utf-8", errors="replace") for p in parts)


def parse_status_uid(text: str) -> int | None:
    """The real uid of a ``/proc/<pid>/status`` text; None when there is no Uid line."""
    m = STATUS_UID_RE.search(text)
    return int(m.group(1)) if m else None


def parse_netns_link(link: str) -> int | None:
    """The namespace inode of a ``/proc/<pid>/ns/net`` link text (``net:[4026531840]`` -> 4026531840)."""
    m = NETNS_LINK_RE.match(link)
    return int(m.group(1)) if m else None


def parse_proc_net_tcp(text: str) -> list[Socket]:
    """Sockets of one ``/proc/net/tcp`` or ``tcp6`` file; the header and unknown lines are skipped."""
    sockets = []
    for line in text.splitlines()[1:]:
        m = PROC_NET_TCP_RE.match(line)
        if m:
            uid, inode = m.group("uid"), m.group("inode")
            port, state = int(m.group("local_port"), 16), m.group("state").upper()
            sockets.append(
                Socket(m.group("local_addr"), port, state, None if uid is None else int(uid), _opt_int(inode))
            )
    return sockets


def _opt_int(text: str | None) -> int | None:
    return None if text is None else int(text)


def parse_socket_link(link: str) -> int | None:
    """The inode of a ``/proc/<pid>/fd/<n>`` link to a socket (``socket:[13024]`` -> 13024), else None."""
    m = SOCKET_LINK_RE.match(link)
    return int(m.group(1)) if m else None


# ----- matching rules ------------------------------------------------------------------------------------------


def command_matches(wanted: str, comm: str, cmdline: Sequence[str]) -> bool:
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
    args = [a for a in cmdline[1:] if a not in PYTHON_FLAGS]
    if len(args) >= 2 and args[0] == "-m":
        return args[1] == wanted or args[1].startswith(wanted + ".")
    return bool(args) and _base(args[0]) == wanted


def runs_package(argv: Sequence[str], package: str) -> bool:
    """Whether an interpreter's argv runs Python package ``package``: what it runs is its first argument past the
    interpreter's flags, ``-m vllm.entrypoints...``, the console script ``/venv/bin/vllm serve``, a file of the
    package ``.../site-packages/ray/_private/workers/default_worker.py``. An argument further on is not what it
    runs: ``pytest tests/test_vllm.py``, ``dgxdoctor check --only ray``, ``grep ray``."""
    target = _run_target(argv)
    if target is None:
        return False
    kind, name = target
    if kind == "module":
        return name == package or name.startswith(package + ".")
    return _base(name) == package or any(f"/{d}/{package}/" in name for d in ("site-packages", "dist-packages"))


# Interpreter flags that take a value (python(1)): ``-X faulthandler``, ``-W ignore``.
FLAGS_WITH_VALUE = ("-X", "-W")


def _run_target(argv: Sequence[str]) -> tuple[str, str] | None:
    """("module", name) of ``-m name``, ("script", path) of the first plain argument; None for ``-c`` or none."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            module = next(args, None)
            return None if module is None else ("module", module)
        if arg == "-c":
            return None
        if arg in FLAGS_WITH_VALUE:
            next(args, None)
            continue
        if arg.startswith("-"):
            continue
        return "script", arg
    return None


def trusted_uids(agent_uid: int | None = None, serving_uid: int | None = None) -> frozenset[int]:
    """The users whose processes may be believed: root, the agent's own user, and the serving user when one is
    configured (``[node] serving_user``). No other user can start a process as them, send them a signal or write
    their argv; anyone can title a process ``VLLM::Worker_TP3``."""
    agent_uid = os.geteuid() if agent_uid is None else agent_uid
    return frozenset(uid for uid in (0, agent_uid, serving_uid) if uid is not None)


def trusted_process(process_uid: int | None, agent_uid: int | None = None, serving_uid: int | None = None) -> bool:
    """Whether a process found by its command line may be believed, or its interpreter executed: anyone can
    title a process ``VLLM::EngineCore`` or run ``python -m vllm...``, so only processes of ``trusted_uids`` are.
    A vLLM run by another user is believed only through a pid file or ``[node] serving_user`` (its listening
    socket is then one of theirs, ``vllm_api.port_view``); its interpreter then needs ``serving_python`` set
    explicitly."""
    return process_uid is not None and process_uid in trusted_uids(agent_uid, serving_uid)


def _base(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


# ----- reading a proc tree -------------------------------------------------------------------------------------


class BootTime:
    """``btime`` of ``<proc_root>/stat``, read once on first use and shared by the processes of one listing."""

    def __init__(self, proc_root: Path) -> None:
        self._path = os.path.join(proc_root, "stat")

    @cached_property
    def seconds(self) -> float | None:
        text = _read_text(self._path)
        return None if text is None else parse_btime(text)


class ProcessInfo:
    """One ``<proc_root>/<pid>``; each field read on first use, then kept (see the module docstring)."""

    def __init__(self, proc_root: Path, pid: int, boot: BootTime | None = None) -> None:
        self.pid = pid
        self._dir = os.path.join(proc_root, str(pid))
        self._boot = boot if boot is not None else BootTime(proc_root)

    def __repr__(self) -> str:
        return f"ProcessInfo(pid={self.pid})"

    @cached_property
    def comm(self) -> str:
        """The kernel's name of the process (15 characters at most); "" when unreadable."""
        text = _read_text(os.path.join(self._dir, "comm"))
        return "" if text is None else text.strip()

    @cached_property
    def cmdline(self) -> tuple[str, ...]:
        """argv; () for kernel threads, zombies and processes gone or unreadable."""
        raw = _read_bytes(os.path.join(self._dir, "cmdline"))
        return () if raw is None else parse_cmdline(raw)

    @cached_property
    def exe(self) -> str | None:
        """The executable's path; None when unreadable (another user's process, a kernel thread, gone).
        The kernel's `` (deleted)`` suffix of a replaced or removed executable is dropped (as psutil does)."""
        try:
            link = os.readlink(os.path.join(self._dir, "exe"))
        except OSError:
            return None
        if link.endswith(DELETED_SUFFIX) and not os.path.exists(link):
            link = link[: -len(DELETED_SUFFIX)]
        return link or None

    @cached_property
    def uid(self) -> int | None:
        """The real uid (``Uid:`` of status); None when unreadable."""
        text = _read_text(os.path.join(self._dir, "status"))
        return None if text is None else parse_status_uid(text)

    @cached_property
    def stat(self) -> ProcStat | None:
        """The parsed stat line; None when gone, unreadable or malformed."""
        text = _read_text(os.path.join(self._dir, "stat"))
        if text is None:
            return None
        try:
            return parse_proc_stat(text)
        except ProcFormatError:
            return None

    @property
    def ppid(self) -> int | None:
        return self.stat.ppid if self.stat is not None else None

    def socket_inodes(self) -> set[int]:
        """Inodes of the sockets this process holds open (``/proc/<pid>/fd``); empty when unreadable."""
        fd_dir = os.path.join(self._dir, "fd")
        inodes: set[int] = set()
        try:
            entries = os.listdir(fd_dir)
        except OSError:
            return inodes
        for name in entries:
            try:
                inode = parse_socket_link(os.readlink(os.path.join(fd_dir, name)))
            except OSError:  # closed meanwhile
                continue
            if inode is not None:
                inodes.add(inode)
        return inodes

    @property
    def state(self) -> str:
        """R, S, D, T, Z, ...; "?" when the stat line is unreadable."""
        return self.stat.state if self.stat is not None else "?"

    @property
    def alive(self) -> bool:
        return self.state not in DEAD_STATES

    @property
    def utime(self) -> int | None:
        return self.stat.utime if self.stat is not None else None

    @property
    def stime(self) -> int | None:
        return self.stat.stime if self.stat is not None else None

    @property
    def cpu_ticks(self) -> int | None:
        return self.stat.cpu_ticks if self.stat is not None else None

    @property
    def start_ticks(self) -> int | None:
        return self.stat.start_ticks if self.stat is not None else None

    @property
    def start_time(self) -> float | None:
        """Start, in seconds since the epoch; None when the stat line or btime is unreadable."""
        btime = self._boot.seconds
        if self.stat is None or btime is None:
            return None
        return btime + self.stat.start_ticks / CLK_TCK

    @cached_property
    def netns(self) -> int | None:
        """Inode of the network namespace; None when unreadable (another user's process without root)."""
        return _netns_of(self._dir)

    def matches(self, wanted: str) -> bool:
        """``command_matches`` on this process's comm and argv."""
        return command_matches(wanted, self.comm, self.cmdline)

    def environ(self) -> bytes:
        """The raw NUL-separated environment, read now and not kept (it may hold secrets). Raises
        PermissionError for another user's process without root, other OSErrors when the process is gone."""
        with open(os.path.join(self._dir, "environ"), "rb") as fh:
            return fh.read()


def iter_processes(proc_root: Path) -> Iterator[ProcessInfo]:
    """Every ``<proc_root>/<pid>``, by pid (kernel threads included; nothing of a process is read until one of
    its fields is asked for)."""
    try:
        pids = sorted(int(entry.name) for entry in os.scandir(proc_root) if entry.name.isdigit())
    except OSError:
        return
    boot = BootTime(proc_root)
    for pid in pids:
        yield ProcessInfo(proc_root, pid, boot)


def read_process(proc_root: Path, pid: int) -> ProcessInfo | None:
    """One process, its stat line read now; None when it is gone (or its stat line is unreadable)."""
    info = ProcessInfo(proc_root, pid)
    return info if info.stat is not None else None


def own_netns(proc_root: Path) -> int | None:
    """The network namespace of ``<proc_root>/self``: the reader's own."""
    return _netns_of(os.path.join(proc_root, "self"))


def processes_named(proc_root: Path, names: Iterable[str], same_netns: bool = True) -> list[ProcessInfo]:
    """Processes whose ``comm`` is one of ``names``, by pid; with ``same_netns``, only those in the reader's
    network namespace when that can be told.

    A raylet in another network namespace belongs to another node (containers, or namespaces used as nodes)
    and serves other addresses. A process whose namespace is unreadable is kept.
    """
    wanted = set(names)
    mine = own_netns(proc_root) if same_netns else None
    found = []
    for proc in iter_processes(proc_root):
        if proc.comm not in wanted:
            continue
        if mine is not None and proc.netns not in (mine, None):
            continue
        found.append(proc)
    return sorted(found, key=lambda p: p.pid)


def listening_sockets(proc_root: Path) -> list[Socket] | None:
    """TCP sockets in LISTEN state in this network namespace, IPv4 and IPv6; None when neither file is readable."""
    sockets: list[Socket] = []
    read_any = False
    for name in ("tcp", "tcp6"):
        text = _read_text(os.path.join(proc_root, "net", name))
        if text is None:
            continue
        read_any = True
        sockets.extend(s for s in parse_proc_net_tcp(text) if s.state == TCP_LISTEN)
    return sockets if read_any else None


def listening_ports(proc_root: Path) -> set[int] | None:
    """TCP ports in LISTEN state in this network namespace, IPv4 and IPv6; None when neither file is readable."""
    sockets = listening_sockets(proc_root)
    return None if sockets is None else {s.port for s in sockets}


def listener_inodes(proc_root: Path, port: int) -> dict[int, int | None]:
    """inode -> owner uid of every socket listening on ``port`` (any address); empty when none or unreadable."""
    return {s.inode: s.uid for s in listening_sockets(proc_root) or () if s.port == port and s.inode is not None}


def socket_ip(local_addr: str) -> IPv4Address | IPv6Address | None:
    """The address of a ``/proc/net/tcp``/``tcp6`` local address field: 32-bit words in host (little-endian)
    order (``0100007F`` -> 127.0.0.1, ``00000000000000000000000001000000`` -> ::1); None when malformed."""
    try:
        raw = bytes.fromhex(local_addr)
    except ValueError:
        return None
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return IPv4Address(words)
    return IPv6Address(words) if len(raw) == 16 else None


def _host_ips(host: str | None) -> tuple[IPv4Address | IPv6Address, ...] | None:
    """The addresses a connection to ``host`` goes to; None for a name other than localhost (not resolved)."""
    if host is None:
        return None
    if host.lower() == "localhost":
        return (IPv4Address("127.0.0.1"), IPv6Address("::1"))
    try:
        return (ip_address(host.strip("[]")),)
    except ValueError:
        return None


def _same_ip(bound: IPv4Address | IPv6Address | None, wanted: IPv4Address | IPv6Address) -> bool:
    if isinstance(bound, IPv6Address) and bound.ipv4_mapped is not None:
        bound = bound.ipv4_mapped
    return bound == wanted


def reaching_listeners(proc_root: Path, port: int, host: str | None) -> dict[int, int | None]:
    """inode -> owner uid of the sockets listening on ``port`` that a connection to ``host`` may reach: those
    bound to its address, else those bound to the wildcard (the kernel prefers the exact bind). Every socket on
    the port when ``host`` is a name (not resolved here): the caller then believes none unless all are believed."""
    sockets = [s for s in listening_sockets(proc_root) or () if s.port == port and s.inode is not None]
    wanted = _host_ips(host)
    if wanted is None:
        return {s.inode: s.uid for s in sockets if s.inode is not None}
    chosen: dict[int, int | None] = {}
    bound = [(s, socket_ip(s.local_addr)) for s in sockets]
    for ip in wanted:
        exact = [s for s, addr in bound if _same_ip(addr, ip)]
        for s in exact or [s for s, addr in bound if addr is not None and addr.is_unspecified]:
            if s.inode is not None:
                chosen[s.inode] = s.uid
    return chosen


def socket_holder(
    proc_root: Path, inodes: Mapping[int, int | None], prefer: Callable[[ProcessInfo], bool] = lambda _: False
) -> ProcessInfo | None:
    """Of the processes holding one of ``inodes`` (inode -> owner uid), the oldest (a server that forked workers
    shares its socket with them). Only processes of the sockets' owner uids are searched, those that ``prefer``
    picks first (their fd links are the cost); None when none is given or no holder is readable."""
    if not inodes:
        return None
    uids = set(inodes.values())
    candidates = [p for p in iter_processes(proc_root) if None in uids or p.uid in uids]
    candidates.sort(key=lambda p: not prefer(p))
    holders = [p for p in candidates if p.stat is not None and p.socket_inodes() & inodes.keys()]
    return min(holders, key=lambda p: (p.start_ticks or 0, p.pid)) if holders else None


def port_owner(
    proc_root: Path, port: int, prefer: Callable[[ProcessInfo], bool] = lambda _: False
) -> ProcessInfo | None:
    """The process listening on TCP ``port`` (any address): ``socket_holder`` of its listening sockets."""
    return socket_holder(proc_root, listener_inodes(proc_root, port), prefer)


def descendants(proc_root: Path, pid: int) -> list[ProcessInfo]:
    """Every process below ``pid`` in the process tree (children, their children ...), by pid, from the parent
    field of each stat line; processes re-parented away (to init, a subreaper) are no longer below it."""
    children: dict[int, list[ProcessInfo]] = {}
    for proc in iter_processes(proc_root):
        if proc.ppid is not None:
            children.setdefault(proc.ppid, []).append(proc)
    found: list[ProcessInfo] = []
    todo = [pid]
    while todo:
        for child in children.pop(todo.pop(), ()):
            found.append(child)
            todo.append(child.pid)
    return sorted(found, key=lambda p: p.pid)


def is_below(by_pid: Mapping[int, ProcessInfo], proc: ProcessInfo, ancestor: int, max_depth: int = 64) -> bool:
    """Whether ``ancestor`` is a parent, grandparent ... of ``proc``, following the parent field of each stat line
    (only the few lines on the way up are read). A process re-parented away (to init, a subreaper) is no longer
    below it; a cycle or an unreadable parent ends the walk."""
    pid = proc.ppid
    for _ in range(max_depth):
        if pid is None or pid <= 1:
            return False
        if pid == ancestor:
            return True
        parent = by_pid.get(pid)
        pid = parent.ppid if parent is not None else None
    return False


def _netns_of(proc_dir: str) -> int | None:
    try:
        return parse_netns_link(os.readlink(os.path.join(proc_dir, "ns", "net")))
    except OSError:
        return None


def _read_bytes(path: str) -> bytes | None:
    """The whole file, None when unreadable. os.open/os.read: half the cost of open() on these small files."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:  # ESRCH: the process exited between open and read
        return None
    finally:
        os.close(fd)


def _read_text(path: str) -> str | None:
    raw = _read_bytes(path)
    return None if raw is None else raw.decode("utf-8", errors="replace")

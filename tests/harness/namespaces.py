"""Nodes as namespaces: each node has its own network namespace (joined to the host by a bridge) and its own PID
namespace with a private /proc, so a node's checks see its own processes and no other job's.

Layout of one network (slot N, held by a lock file so parallel jobs on one machine never share names)::

    host: bridge dgxhN-br 10.120.N.254/24 (Prometheus, Alertmanager, the test)
      |-- netns dgxhN-a  10.120.N.1 (eth0), PID namespace: init, then what the test starts there
      `-- netns dgxhN-b  10.120.N.2 (eth0), ...

The namespaces have no default route: nothing leaves the machine, and the host reaches a node only through the
bridge's connected route. Each node's PID namespace has a small init as its PID 1 (it reaps orphans); ending it
ends every process of the node at once (the kernel kills the namespace), as powering the node off would.
``ip netns exec`` binds ``/etc/netns/<name>/hosts`` over ``/etc/hosts``: the nodes resolve each other by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SLOTS = range(0, 100)
# PID 1 of a node: reaps whatever is reparented to it, exits on SIGTERM (then the kernel kills the namespace).
INIT = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)


def why_not_runnable() -> str | None:
    """Why namespaced nodes cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root to create network and PID namespaces"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2, util-linux)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=15)


def child_pid(pid: int, limit_s: float = 10.0) -> int:
    """The first child of ``pid`` (the process ``unshare --fork`` or ``nsenter`` runs), waiting for it."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.02)
    raise RuntimeError(f"process {pid} started no child within {limit_s} s")


@dataclass
class Spawned:
    """A process started inside a node: ``outer`` is the ``nsenter`` this test holds, ``pid`` the process itself
    (its pid as the host sees it)."""

    argv: Sequence[str]
    outer: subprocess.Popen[bytes]
    pid: int

    def alive(self) -> bool:
        return self.outer.poll() is None

    def signal(self, sig: int, group: bool = True) -> None:
        """``sig`` to the process (and its process group: it leads one), as ``systemctl kill`` would."""
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def stop(self, limit_s: float = 15.0) -> int | None:
        """SIGTERM, SIGKILL after ``limit_s``; the exit status (None when it had to be killed)."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        try:
            return self.outer.wait(limit_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.outer.wait(10)
            return None


@dataclass
class NodeNamespaces:
    """One node's network and PID namespaces."""

    netns: str
    veth: str
    ip: str
    hosts: dict[str, str]
    init: subprocess.Popen[bytes] | None = None
    init_pid: int = 0  # PID 1 of the node, as the host sees it
    spawned: list[Spawned] = field(default_factory=list)

    def create(self, bridge: str) -> None:
        ip("netns", "add", self.netns)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("link", "set", self.veth, "master", bridge, "up")
        ip("-n", self.netns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        etc = Path("/etc/netns") / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        names = "".join(f"{addr} {name}\n" for name, addr in self.hosts.items())
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        self.init = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
             sys.executable, "-c", INIT],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # unshare's notes on signal masks under a test runner
        )  # fmt: skip
        self.init_pid = child_pid(self.init.pid)
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.init_pid}/ns/pid") == os.readlink("/proc/self/ns/pid"):
            assert time.monotonic() < deadline, "the node's PID namespace did not appear"
            time.sleep(0.02)

    def enter(self, cwd: Path | None = None) -> list[str]:
        """The prefix that runs a command in this node: its network, PID and mount namespaces (its /proc)."""
        return ["nsenter", f"--target={self.init_pid}", "--net", "--pid", "--mount", *([f"--wd={cwd}"] if cwd else [])]

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | None = None,
        stdin: int | IO[bytes] | None = subprocess.DEVNULL,
        preexec: Callable[[], object] | None = None,
        pipe: bool = False,
    ) -> Spawned:
        """Start ``argv`` inside the node, in a session of its own (a unit's processes form one group). Its output
        goes to ``log``, or with ``pipe`` to ``Spawned.outer.stdout`` for the caller to read."""
        with contextlib.ExitStack() as stack:
            out: int | IO[bytes] = subprocess.PIPE if pipe else subprocess.DEVNULL
            if log and not pipe:
                out = stack.enter_context(log.open("ab"))
            outer = subprocess.Popen(
                [*self.enter(cwd), "--", "setsid", *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=stdin,
                preexec_fn=preexec,
            )
        inner = child_pid(outer.pid)  # nsenter forks into the PID namespace; setsid execs in place
        started = Spawned(argv, outer, inner)
        self.spawned.append(started)
        return started

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run ``argv`` inside the node to completion (a command an operator types on it)."""
        return subprocess.run([*self.enter(cwd), "--", *argv], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    def pids(self) -> list[int]:
        """Every process of the node, as the host numbers them."""
        own = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/pid") == own:
                        found.append(int(entry))
        return found

    def destroy(self) -> None:
        for proc in reversed(self.spawned):
            if proc.alive():
                proc.stop(10)
        if self.init is not None and self.init.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)  # PID 1 gone: the kernel kills the rest of the node
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.init.wait(10)
        remove_netns(self.netns, self.veth)


def remove_netns(netns: str, veth: str) -> None:
    for pid in ip("netns", "pids", netns, check=False).stdout.split():  # only processes of our own namespace
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", netns, check=False)
    ip("link", "del", veth, check=False)
    shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)


class Network:
    """A bridge on the host and a /24 for the nodes, in a slot no other job holds (a lock file per slot)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.lock = self._take_slot()
        self.slot = int(Path(self.lock.name).stem.rsplit("-", 1)[1])
        self.prefix = f"dgxh{self.slot}"
        self.bridge = f"{self.prefix}-br"
        self.host_ip = f"10.120.{self.slot}.254"
        hosts = {name: f"10.120.{self.slot}.{i + 1}" for i, name in enumerate(names)}
        self.nodes = {
            name: NodeNamespaces(f"{self.prefix}-{name}", f"{self.prefix}-v{i}", hosts[name], hosts)
            for i, name in enumerate(names)
        }

    @staticmethod
    def _take_slot() -> IO[str]:
        for slot in SLOTS:
            lock = open(f"/tmp/dgxd-harness-{slot}.lock", "w")  # noqa: SIM115 - held until close()
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            return lock
        raise RuntimeError("every harness network slot is taken")

    def create(self) -> None:
        self._remove()  # what a killed run of this slot left behind (the lock says no one uses it)
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for node in self.nodes.values():
            node.create(self.bridge)
            assert not ip("-n", node.netns, "route", "show", "default").stdout.strip()

    def isolate(self, on: bool = True) -> None:
        """Cut (or restore) the links between the nodes, leaving each reachable from the host: the bridge stops
        forwarding between its node ports (``bridge link set ... isolated on``)."""
        for node in self.nodes.values():
            subprocess.run(["bridge", "link", "set", "dev", node.veth, "isolated", "on" if on else "off"],
                           check=True, capture_output=True, timeout=15)  # fmt: skip

    def _remove(self) -> None:
        for node in self.nodes.values():
            remove_netns(node.netns, node.veth)
        ip("link", "del", self.bridge, check=False)

    def destroy(self) -> None:
        try:
            for node in self.nodes.values():
                node.destroy()
            ip("link", "del", self.bridge, check=False)
        finally:
            self.lock.close()

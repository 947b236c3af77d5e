"""A real Slurm controller and node daemon on this machine, for the tests of ``dgxdoctor slurm-health``.

Debian 12's slurm-wlm 22.05 (scripts/install-system-deps installs it), started by the test with a private
slurm.conf: its own SlurmctldPort and SlurmdPort, StateSaveLocation, spool, PID and log files under the test's
directory, so it meets no other Slurm on the machine. ``AuthType=auth/none`` (22.05 still ships the plugin):
munged would need its own key, socket and a non-root user for nothing these tests look at. The truth is ``scontrol
show node``, asked with ``SLURM_CONF`` pointing at the private config.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from daemonproc import free_port
from dgxdoctor.sources.slurm import SlurmNode, parse_show_node

PROGRAMS = ("slurmctld", "slurmd", "scontrol")


def missing() -> str | None:
    """Why a Slurm cluster cannot start here, or None."""
    absent = [p for p in PROGRAMS if shutil.which(p) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurm-wlm; scripts/install-system-deps does)"
    if os.geteuid() != 0:
        return "slurmd runs as root (SlurmdUser=root)"
    return None


CONF = """\
ClusterName=dgxdtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
ReturnToService=2
{extra}
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES State=UP
"""


@dataclass
class SlurmCluster:
    root: Path
    node: str = "dgxd-node1"
    extra: str = ""  # more slurm.conf lines (HealthCheckProgram ...)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        for sub in ("state", f"spool/{self.node}", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]  # slurmctld runs only where SlurmctldHost names this host
        self.conf.write_text(CONF.format(host=host, ctld_port=free_port(), slurmd_port=free_port(), root=self.root,
                                         node=self.node, extra=self.extra))  # fmt: skip
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: "is UP" in self.scontrol("ping").stdout, 30, "slurmctld up")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: self.show().flags & {"IDLE", "ALLOCATED", "MIXED"} != set(), 60, "the node IDLE")
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        with (self.root / "log" / f"{name}.out").open("ab") as out:
            self.procs.append(subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))  # fmt: skip

    def _wait(self, ready: object, limit_s: float, what: str) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            for proc in self.procs:
                assert proc.poll() is None, f"{proc.args[0]} exited:\n{self.logs()}"  # type: ignore[index]
            with contextlib.suppress(AssertionError, ValueError, subprocess.TimeoutExpired):
                if ready():  # type: ignore[operator]
                    return
            time.sleep(0.3)
        raise AssertionError(f"not {what} within {limit_s} s:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=20,
                              check=False)  # fmt: skip

    def show(self) -> SlurmNode:
        done = self.scontrol("show", "node", self.node)
        assert done.returncode == 0, done.stderr
        return parse_show_node(done.stdout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


@contextlib.contextmanager
def slurm_cluster(root: Path, extra: str = "") -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, extra=extra)
    try:
        yield cluster.start()
    finally:
        cluster.stop()

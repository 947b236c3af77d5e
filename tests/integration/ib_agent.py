"""A real dgxdoctor daemon that reads a sysfs-shaped InfiniBand tree whose rail a test takes down and brings back:
the node under test of the Slurm and node-condition tests.

The tree is tests/fixtures/sysfs_ib's healthy DGX (every rail Active); ``rail(up=False)`` writes mlx5_3's port
Down/Polling, so the infiniband check goes CRITICAL (IB_PORT_DOWN), and ``rail(up=True)`` clears it. Only that check
runs: this machine's own state (an XID another test wrote to /dev/kmsg) stays out. The daemon's /state opens with
the read token, as the commands that read it use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from daemonproc import DaemonProc
from dgxdoctor.checks.registry import ALL_CHECKS
from sysfstree import build_sysfs_tree

TOKEN = "read-token-0123456789abcdef"
RAIL = "class/infiniband/mlx5_3/ports/1"
RAIL_DOWN_REASON = "dgxdoctor:IB_PORT_DOWN:mlx5_3/1"


def config(root: Path, sysfs: Path) -> str:
    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name != "infiniband")
    token = root / "read.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return (f'node = "dgx-a"\n[paths]\nstate_dir = "{root / "state"}"\nsysfs_root = "{sysfs}"\n'
            f'[daemon]\nlisten = "@LISTEN@"\nread_token_file = "{token}"\n'
            f"[checks.infiniband]\ninterval_s = 0.5\n{quiet}")  # fmt: skip


class IbAgent:
    def __init__(self, daemon: DaemonProc, sysfs: Path) -> None:
        self.daemon, self.sysfs = daemon, sysfs

    @property
    def config(self) -> Path:
        return self.daemon.workdir / "config.toml"

    def rail(self, up: bool) -> None:
        (self.sysfs / RAIL / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (self.sysfs / RAIL / "phys_state").write_text("5: LinkUp\n" if up else "2: Polling\n")
        want = "ok" if up else "critical"
        self.daemon.wait_for(lambda: self.ib_status() == want, 30, f"infiniband {want}")

    def ib_status(self) -> str:
        doc = self.daemon.get("/state", auth=True).json()
        return str(next(c["status"] for c in doc["checks"] if c["name"] == "infiniband"))


@contextlib.contextmanager
def ib_agent(root: Path) -> Iterator[IbAgent]:
    sysfs = build_sysfs_tree(root / "sysfs", "dgx_ndr_healthy.txt")
    daemon = DaemonProc(root / "agent", config(root, sysfs), token=TOKEN).start()
    try:
        daemon.wait_healthy()
        agent = IbAgent(daemon, sysfs)
        daemon.wait_for(lambda: agent.ib_status() == "ok", 30, "infiniband ok")
        yield agent
    finally:
        daemon.stop()

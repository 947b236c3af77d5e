"""The fleet breaker with real agents on loopback: five daemons, each reading its own InfiniBand tree; the first
(n0, act mode, a fake ``systemctl`` first on its PATH recording every call) compares itself with the other four
over their /state, as the peer comparison does. Two peers' rails stuck in INIT (IB_PORT_NOT_ACTIVE: critical, but
not a hardware cause the hardware gate would refuse for) are 40 % of the fleet: an alert asking n0 to restart vLLM
is refused by the fleet breaker, audited, and nothing runs. The rails Active again, the same alert restarts vLLM.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemonproc import DaemonProc, free_port
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.remediation.audit import AUDIT_FILE
from harness.fleet import fake_systemctl
from sysfstree import build_sysfs_tree

pytestmark = pytest.mark.integration

TOKEN = "fleet-breaker-token-0123456789"
RAIL = "class/infiniband/mlx5_3/ports/1"
VLLM_DOWN = {"alertname": "DgxdoctorVllmDown", "node": "n0", "dgxdoctor_action": "restart_vllm"}
ALERT = {"version": "4", "alerts": [{"status": "firing", "fingerprint": "f1", "startsAt": "2026-12-01T00:00:00Z",
                                     "labels": VLLM_DOWN}]}  # fmt: skip


def token_file(root: Path) -> Path:
    path = root / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


# n0 alone compares with the others and acts; its alert token is the same file (the test holds one secret).
ACTOR = (
    'alert_token_file = "{token}"\n[checks.peer_compare]\ninterval_s = 1.0\n'
    '[remediation]\nmode = "act"\nrole = "head"\nhold_s = 0\nvllm_start_grace_s = 0\nverify_timeout_s = 1\n'
    "drain = false\n"
)


def config(root: Path, name: str, sysfs: Path, peers: list[str]) -> str:
    keep = {"infiniband", "peer_compare"} if peers else {"infiniband"}
    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name not in keep)
    token = token_file(root)
    return (f'node = "{name}"\n[paths]\nstate_dir = "{root / "state"}"\nsysfs_root = "{sysfs}"\n'
            f'[checks.infiniband]\ninterval_s = 0.5\n{quiet}'
            f'[daemon]\nlisten = "@LISTEN@"\npeer_token_file = "{token}"\npeers = {json.dumps(peers)}\n'
            f"peer_timeout_s = 2.0\n{ACTOR.format(token=token) if peers else ''}")  # fmt: skip


def rail(sysfs: Path, active: bool) -> None:
    (sysfs / RAIL / "state").write_text("4: ACTIVE\n" if active else "2: INIT\n")


class Fleet:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: dict[str, DaemonProc] = {}
        self.sysfs: dict[str, Path] = {}

    def start(self) -> Fleet:
        ports: dict[str, int] = {}
        for i in range(5):  # a port just freed can be handed out again: never two nodes on one
            port = free_port()
            while port in ports.values():
                port = free_port()
            ports[f"n{i}"] = port
        for name, port in ports.items():
            home = self.root / name
            home.mkdir()
            self.sysfs[name] = build_sysfs_tree(home / "sysfs", "dgx_ndr_healthy.txt")
            peers = [f"http://127.0.0.1:{p}" for n, p in ports.items() if n != name] if name == "n0" else []
            env = {"PATH": f"{fake_systemctl(home)}:{os.environ['PATH']}"} if name == "n0" else {}
            proc = DaemonProc(home, config(home, name, self.sysfs[name], peers), port=port, token=TOKEN, env=env)
            self.nodes[name] = proc.start()
        for proc in self.nodes.values():
            proc.wait_healthy()
        return self

    def stop(self) -> None:
        for proc in self.nodes.values():
            proc.stop()

    @property
    def n0(self) -> DaemonProc:
        return self.nodes["n0"]

    def calls(self) -> list[str]:
        path = self.root / "n0" / "systemctl.calls"
        return path.read_text().splitlines() if path.exists() else []

    def audit(self) -> list[dict[str, Any]]:
        path = self.root / "n0" / "state" / AUDIT_FILE
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f.start()
    finally:
        f.stop()


def test_two_of_five_down_refuse_the_restart_until_they_recover(fleet: Fleet) -> None:
    for name in ("n1", "n2"):
        rail(fleet.sysfs[name], active=False)
    for name in ("n1", "n2"):  # their own check says so first: a peer that n0 could not reach yet opened it too
        peer = fleet.nodes[name]
        peer.wait_for(lambda p=peer: p.metric("dgxdoctor_check_status", check="infiniband") == 2.0, 30, "rail down")
    n0 = fleet.n0
    n0.wait_for(lambda: n0.metric("dgxdoctor_remediation_fleet_breaker_open") == 1.0, 30, "the fleet breaker open")
    answer = httpx.post(f"{n0.url}/alertmanager", json=ALERT, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert answer.status_code == 200, answer.text

    def refused() -> bool:
        return any(e.get("verdict") == "refuse" and "fleet breaker" in e.get("reason", "") for e in fleet.audit())

    n0.wait_for(refused, 15, "the restart refused by the fleet breaker")
    reason = next(e["reason"] for e in fleet.audit() if "fleet breaker" in e.get("reason", ""))
    assert "2 of 5 (40 %) nodes unhealthy: n1, n2" in reason, reason
    time.sleep(2)  # evaluated again every second: still nothing runs
    assert fleet.calls() == []
    assert (n0.metric("dgxdoctor_remediation_fleet_refused_total") or 0) >= 1

    for name in ("n1", "n2"):
        rail(fleet.sysfs[name], active=True)
    n0.wait_for(lambda: fleet.calls() == ["restart vllm.service"], 30, "vLLM restarted once the fleet is back")
    assert n0.metric("dgxdoctor_remediation_fleet_breaker_open") == 0.0

"""``dgxdoctor conditions --json`` from a real daemon's latest results (tests/integration/ib_agent.py): a rail
down is RdmaPortDown True, named; its lastTransitionTime holds from run to run while the status does; the rail
back is False again; ``--condition`` answers as a node-problem-detector custom plugin; a stopped daemon is every
condition Unknown, never False."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ib_agent import IbAgent, ib_agent

from conftest import run_cli

pytestmark = pytest.mark.integration


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[IbAgent]:
    with ib_agent(tmp_path) as a:
        yield a


def conditions(agent: IbAgent, code: int) -> dict[str, dict[str, Any]]:
    done = run_cli("conditions", "--json", "--config", str(agent.config))
    assert done.returncode == code, done.stdout + done.stderr
    doc = done.json()
    assert doc["node"] == "dgx-a" and doc["source"] == "dgxdoctor"
    return {c["type"]: c for c in doc["conditions"]}


def test_a_rail_down_is_rdma_port_down_until_it_is_back(agent: IbAgent) -> None:
    healthy = conditions(agent, 0)
    assert {c["status"] for c in healthy.values()} == {"False"}
    assert healthy["RdmaPortDown"]["reason"] == "RdmaPortsActive"
    for c in healthy.values():
        assert set(c) == {"type", "status", "reason", "message", "lastHeartbeatTime", "lastTransitionTime"}

    agent.rail(up=False)
    time.sleep(1.1)  # the transition's second differs from the first run's
    down = conditions(agent, 2)
    rdma = down["RdmaPortDown"]
    assert (rdma["status"], rdma["reason"]) == ("True", "IbPortDown") and "mlx5_3/1" in rdma["message"]
    assert rdma["lastTransitionTime"] != healthy["RdmaPortDown"]["lastTransitionTime"]
    assert [t for t, c in down.items() if c["status"] == "True"] == ["RdmaPortDown"]
    # the other conditions kept their status: their transition is the first run's
    assert down["GpuXidCritical"]["lastTransitionTime"] == healthy["GpuXidCritical"]["lastTransitionTime"]
    plugin = run_cli("conditions", "--condition", "RdmaPortDown", "--config", str(agent.config))
    assert plugin.returncode == 1 and plugin.stdout.startswith("IbPortDown: mlx5_3/1"), plugin.stdout  # NonOK
    time.sleep(1.1)
    still = conditions(agent, 2)["RdmaPortDown"]
    assert still["lastTransitionTime"] == rdma["lastTransitionTime"]
    assert still["lastHeartbeatTime"] != rdma["lastHeartbeatTime"]

    agent.rail(up=True)
    assert conditions(agent, 0)["RdmaPortDown"]["status"] == "False"
    plugin = run_cli("conditions", "--condition", "RdmaPortDown", "--config", str(agent.config))
    assert plugin.returncode == 0 and plugin.stdout.startswith("RdmaPortsActive"), plugin.stdout  # OK

    agent.daemon.stop()
    gone = conditions(agent, 3)
    assert {c["status"] for c in gone.values()} == {"Unknown"}
    assert gone["RdmaPortDown"]["reason"] == "DgxdoctorUnavailable"
    plugin = run_cli("conditions", "--condition", "RdmaPortDown", "--config", str(agent.config))
    assert plugin.returncode == 2, plugin.stdout  # Unknown

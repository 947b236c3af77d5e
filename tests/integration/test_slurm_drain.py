"""``dgxdoctor slurm-health`` against a real slurmctld and slurmd (tests/integration/slurm_cluster.py) and a real
dgxdoctor daemon whose InfiniBand rail the test takes down and brings back (tests/integration/ib_agent.py), with
``scontrol show node`` as the truth. slurm-health is run as slurmd runs its HealthCheckProgram: ``SLURMD_NODENAME``
in the environment, no argument but the config; and in the last test slurmd runs it itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ib_agent import RAIL_DOWN_REASON, IbAgent, ib_agent
from slurm_cluster import SlurmCluster, missing, slurm_cluster

from conftest import REPO, CliRun, run_cli
from dgxdoctor.sources.slurm import SlurmNode

pytestmark = [pytest.mark.integration, pytest.mark.skipif(missing() is not None, reason=str(missing()))]

# slurmd kills its HealthCheckProgram after 60 s; ours reads one document and runs scontrol twice at most.
WITHIN_S = 10.0


class Node:
    """The node under test: its Slurm record and its agent."""

    def __init__(self, slurm: SlurmCluster, agent: IbAgent) -> None:
        self.slurm, self.agent = slurm, agent

    def health(self, *more: str) -> CliRun:
        t0 = time.monotonic()
        done = run_cli("slurm-health", "--config", str(self.agent.config), *more,
                       env={**self.slurm.env, "SLURMD_NODENAME": self.slurm.node}, timeout=60)  # fmt: skip
        took = time.monotonic() - t0
        assert took < WITHIN_S, f"slurm-health took {took:.1f} s"
        return done

    def rail(self, up: bool) -> None:
        self.agent.rail(up)


@contextlib.contextmanager
def started(root: Path, slurm_conf: str = "") -> Iterator[Node]:
    with ib_agent(root) as agent, slurm_cluster(root / "slurm", slurm_conf) as slurm:
        yield Node(slurm, agent)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with started(tmp_path) as n:
        yield n


def test_a_critical_drains_with_its_reason_and_clearing_resumes(node: Node) -> None:
    healthy = node.health()
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert not node.slurm.show().drained

    node.rail(up=False)
    rehearsed = node.health("--dry-run")
    assert rehearsed.returncode == 0 and f"would drain {node.slurm.node}" in rehearsed.stdout, rehearsed.stdout
    assert not node.slurm.show().drained
    drained = node.health()
    assert drained.returncode == 0, drained.stdout + drained.stderr
    record = node.slurm.show()
    assert record.drained, record
    assert record.reason == RAIL_DOWN_REASON, record
    again = node.health()  # still critical: nothing to change
    assert again.returncode == 0 and "stays drained" in again.stdout, again.stdout
    assert node.slurm.show().reason == RAIL_DOWN_REASON

    node.rail(up=True)
    resumed = node.health()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = node.slurm.show()
    assert not record.drained and record.reason is None, record


def test_an_operators_drain_is_left_alone(node: Node) -> None:
    done = node.slurm.scontrol("update", f"nodename={node.slurm.node}", "state=drain", "reason=maintenance window")
    assert done.returncode == 0, done.stderr
    node.rail(up=False)
    assert node.health().returncode == 0
    record = node.slurm.show()
    assert record.drained and record.reason == "maintenance window", record  # not replaced by ours
    node.rail(up=True)
    left = node.health()
    assert left.returncode == 0 and "someone else" in left.stdout, left.stdout
    record = node.slurm.show()
    assert record.drained and record.reason == "maintenance window", record  # never resumed by us


def test_no_answer_from_the_daemon_is_no_drain(node: Node) -> None:
    node.rail(up=False)
    node.agent.daemon.stop()
    done = node.health()
    assert done.returncode == 69, done.stdout + done.stderr
    assert "UNKNOWN" in done.stdout and "no drain" in done.stdout, done.stdout
    assert not node.slurm.show().drained


def hook(root: Path) -> Path:
    """What docs/fleet.md puts in HealthCheckProgram: a script without arguments. slurmd runs it with only
    SLURMD_NODENAME in its environment, so the script names this test's slurm.conf and Python."""
    script = root / "dgxdoctor-slurm-health"
    script.write_text(f"""#!/bin/sh
export SLURM_CONF={root / "slurm" / "slurm.conf"} PATH={os.environ["PATH"]} PYTHONPATH={REPO / "src"}
echo "SLURMD_NODENAME=$SLURMD_NODENAME" >>{root / "hook.log"}
exec {sys.executable} -m dgxdoctor slurm-health --config {root / "agent" / "config.toml"} >>{root / "hook.log"} 2>&1
""")
    script.chmod(0o755)
    return script


def test_slurmd_runs_it_as_its_health_check_program(tmp_path: Path) -> None:
    """slurmd itself runs the hook every HealthCheckInterval: the drain and the resume come without the test
    running anything but the fault."""
    lines = f"HealthCheckProgram={hook(tmp_path)}\nHealthCheckInterval=2\nHealthCheckNodeState=ANY,CYCLE"
    with started(tmp_path, lines) as n:
        n.rail(up=False)
        slurm_waits(n, lambda r: r.drained and r.reason == RAIL_DOWN_REASON, "drained by the hook")
        n.rail(up=True)
        slurm_waits(n, lambda r: not r.drained, "resumed by the hook")
    log = (tmp_path / "hook.log").read_text()
    assert f"SLURMD_NODENAME={n.slurm.node}" in log, log


def slurm_waits(n: Node, predicate: Callable[[SlurmNode], bool], what: str, limit_s: float = 30.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if predicate(n.slurm.show()):
            return
        time.sleep(0.5)
    raise AssertionError(f"not {what} within {limit_s} s: {n.slurm.show()}\n{n.slurm.logs()}")

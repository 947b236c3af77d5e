"""The whole cluster from one node, with two real dgxdoctor daemons on the multi-node harness (tests/harness: each
node in its own network and PID namespace, installed as the README says, sharing the README's token file):
``check --cluster`` on either node shows both and exits with the worst status; ``bundle --cluster`` gives one
archive with both nodes' parts, the manifests, the clock offsets and none of the secrets planted on both nodes;
with dgx-b's daemon stopped, dgx-b is UNKNOWN within the deadline.

dgx-a reads the healthy InfiniBand tree, dgx-b the degraded one (a rail down: CRITICAL), so "the worst" is real.
No role is declared, so what this machine lacks (GPUs, vLLM, Ray) is SKIPPED, not CRITICAL; each node's PID
namespace keeps other jobs' processes (a vLLM or Ray of another test) out of its checks: one runs beside them
(``other_job``); in the host's PID namespace it made dgx-a CRITICAL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgxdoctor.result import Status, exit_code
from harness import PORT, PROGRAMS, Cluster, Node
from harness.deployment import copy_program
from sysfstree import build_sysfs_tree

pytestmark = pytest.mark.integration

HF = "hf_PLANTEDclusterABCDEFGHIJKLMNOP"
URL_PASSWORD = "proxyPLANTEDpw42"


@pytest.fixture
def other_job(tmp_path: Path) -> Iterator[None]:
    """Another job's vLLM on this machine, outside the nodes: a headless mp worker whose master nobody serves. A
    node that saw it (the host's PID namespace) would call its own vLLM's master unreachable: CRITICAL."""
    program = copy_program(PROGRAMS / "vllm.py", tmp_path / "other-job" / "vllm")
    proc = subprocess.Popen([sys.executable, str(program), "serve", "/models/other", "--nnodes", "2", "--node-rank",
                             "1", "--headless", "--master-addr", "127.0.0.1", "--master-port", "1"],
                            start_new_session=True)  # fmt: skip
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
def nodes(tmp_path: Path, other_job: None) -> Iterator[tuple[Node, Node]]:
    with Cluster({"dgx-a": None, "dgx-b": None}) as cluster:
        a, b = cluster["dgx-a"], cluster["dgx-b"]
        for n, tree in ((a, "dgx_ndr_healthy.txt"), (b, "dgx_ndr_degraded.txt")):
            sysfs = build_sysfs_tree(tmp_path / f"sysfs-{n.name}", tree)
            log = n.root / "var" / "log" / "vllm" / f"vllm-{n.name}.log"
            log.parent.mkdir(parents=True)
            log.write_text(f"INFO HF_TOKEN={HF}\nINFO using proxy http://svc:{URL_PASSWORD}@10.80.0.9:3128\n")
            n.configure(extra={"paths": {"sysfs_root": str(sysfs)},
                               "daemon": {"peer_timeout_s": 1.0, "check_run_min_interval_s": 0},
                               "checks.logs": {"vllm_paths": [str(log)], "ray_paths": []}})  # fmt: skip
        cluster.start_daemons()
        yield a, b


def cli(n: Node, *args: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], float]:
    """`dgxdoctor ARGS --config /etc/dgxdoctor/config.toml` typed on node ``n``; (result, seconds)."""
    t0 = time.monotonic()
    done = n.cli(*args, "--config", str(n.config), timeout=timeout)
    return done, time.monotonic() - t0


def test_check_cluster_from_either_node_then_the_peer_stopped(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    single, single_s = cli(a, "check")
    for me, other in ((a, b), (b, a)):
        done, took = cli(me, "check", "--cluster", "--json")
        doc = json.loads(done.stdout)
        by_node = {n["node"]: n for n in doc["nodes"]}
        assert set(by_node) == {"dgx-a", "dgx-b"}, done.stdout[-2000:]
        assert by_node[me.name]["local"] and not by_node[other.name]["local"]
        assert by_node["dgx-b"]["status"] == "critical"  # the degraded rails
        ib = next(c for c in by_node["dgx-b"]["results"]["checks"] if c["name"] == "infiniband")
        assert ib["status"] == "critical" and ib["findings"]
        assert by_node[other.name]["clock_offset_s"] is not None
        statuses = [Status(n["status"]) for n in doc["nodes"]] + [Status(f["status"]) for f in
                                                                   doc["comparison"]["findings"]]  # fmt: skip
        assert doc["status"] == Status.worst(statuses).value == "critical"
        assert done.returncode == exit_code(Status.CRITICAL) == 2, done.stderr[-2000:]
        drift = [f for f in doc["comparison"]["findings"] if f["code"] == "PEER_HARDWARE_DRIFT"]
        # Two nodes: no majority, so neither node is named, whichever asks (fleet/compare.py).
        assert drift and all(f["subject"] is None for f in drift), drift
        assert doc["comparison"]["drifts"] and all(d["odd"] == [] for d in doc["comparison"]["drifts"])
        print(f"{me.name}: check {single_s:.1f} s, check --cluster {took:.1f} s")
        assert took <= 1.5 * single_s + 2.0  # the peer runs at the same time, not after
    table, _ = cli(a, "check", "--cluster")
    assert "dgx-a" in table.stdout and "dgx-b" in table.stdout and "infiniband" in table.stdout
    # dgx-a alone is not critical (the worst above was dgx-b's): no other job's processes in its checks
    assert single.returncode in (0, 1), single.stdout[-3000:]

    b.stop_daemon()
    done, took = cli(a, "check", "--cluster", "--json", "--deadline", "5")
    doc = json.loads(done.stdout)
    peer = next(n for n in doc["nodes"] if not n["local"])
    assert peer["status"] == "unknown" and peer["node"] == f"dgx-b:{PORT}" and peer["error"]
    assert took < 5 + 4.0, took  # the deadline, plus starting Python
    local = Status(next(n for n in doc["nodes"] if n["local"])["status"])
    assert done.returncode == exit_code(Status.worst([local, Status.UNKNOWN]))


def test_bundle_cluster_has_both_parts_offsets_and_no_secret(nodes: tuple[Node, Node], tmp_path: Path) -> None:
    a, _ = nodes
    out = tmp_path / "cluster.tar.gz"
    done, _ = cli(a, "bundle", "--cluster", "--since", "1h", "--deadline", "60", "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    top = json.loads(files["cluster/manifest.json"])
    assert [n["node"] for n in top["nodes"]] == ["dgx-a", "dgx-b"]
    assert top["nodes"][1]["error"] is None and isinstance(top["nodes"][1]["clock_offset_s"], float)
    for node in ("dgx-a", "dgx-b"):
        manifest = json.loads(files[f"cluster/{node}/manifest.json"])
        assert {e["file"] for e in manifest["files"]} >= {"results.json", "state.json", "kernel.log", "infiniband.txt"}
        assert f"cluster/{node}/infiniband.txt" in files and f"cluster/{node}/logs/vllm/vllm-{node}.log" in files
        state = json.loads(files[f"cluster/{node}/state.json"])  # the daemon's own /state, read with its token
        assert state["node"] == node and state["checks"], state
    everything = b"\n".join(files.values())
    for secret in (a.token, HF, URL_PASSWORD):
        assert secret.encode() not in everything, secret
    assert b"HF_TOKEN=<redacted>" in files["cluster/dgx-b/logs/vllm/vllm-dgx-b.log"]

"""The whole cluster from one node, with two real dgxdoctor daemons in two network namespaces ("nodes") joined by a
veth pair and sharing a real token: ``check --cluster`` on either node shows both and exits with the worst status;
``bundle --cluster`` gives one archive with both nodes' parts, the manifests, the clock offsets and none of the
secrets planted on both nodes; with dgx-b's daemon stopped, dgx-b is UNKNOWN within the deadline.

dgx-a reads the healthy InfiniBand tree, dgx-b the degraded one (a rail down: CRITICAL), so "the worst" is real.
Namespaces are ``dgxd-clu-*`` on 10.80.0.0/24 with no default route, so nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_two_nodes import Node, can_make_netns, sh

from conftest import REPO
from dgxdoctor.result import Status, exit_code
from sysfstree import build_sysfs_tree

pytestmark = pytest.mark.integration

TOKEN = "cluster-nodes-token-0123456789"
PORT = 9835
HF = "hf_PLANTEDclusterABCDEFGHIJKLMNOP"
URL_PASSWORD = "proxyPLANTEDpw42"


def config(tmp: Path, n: Node, peer: Node, tree: str) -> Path:
    sysfs = build_sysfs_tree(tmp / f"sysfs-{n.name}", tree)
    kmsg = tmp / f"kmsg-{n.name}.log"
    kmsg.write_text("")
    log = tmp / f"vllm-{n.name}.log"
    log.write_text(f"INFO HF_TOKEN={HF}\nINFO using proxy http://svc:{URL_PASSWORD}@10.80.0.9:3128\n")
    path = tmp / f"{n.name}.toml"
    path.write_text(
        f'node = "{n.name}"\n'
        f'[paths]\nstate_dir = "{tmp / n.name}"\nsysfs_root = "{sysfs}"\nkmsg_path = "{kmsg}"\n'
        f'[daemon]\nlisten = "0.0.0.0:{PORT}"\ntoken = "{TOKEN}"\n'
        f'peers = ["http://{peer.ip}:{PORT}"]\npeer_timeout_s = 1.0\ncheck_run_min_interval_s = 0\n'
        f'[checks.logs]\nvllm_paths = ["{log}"]\nray_paths = []\n'
    )
    return path


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node, dict[str, Path]]]:
    reason = can_make_netns()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 100000
    a = Node("dgx-a", f"dgxd-clu-a-{tag}", f"dca{tag}", "10.80.0.1")
    b = Node("dgx-b", f"dgxd-clu-b-{tag}", f"dcb{tag}", "10.80.0.2")
    configs: dict[str, Path] = {}
    try:
        for n in (a, b):
            sh("ip", "netns", "add", n.netns)
            sh("ip", "-n", n.netns, "link", "set", "lo", "up")
        sh("ip", "link", "add", a.veth, "netns", a.netns, "type", "veth", "peer", "name", b.veth, "netns", b.netns)
        for n in (a, b):
            sh("ip", "-n", n.netns, "addr", "add", f"{n.ip}/24", "dev", n.veth)
            sh("ip", "-n", n.netns, "link", "set", n.veth, "up")
        for n, peer, tree in ((a, b, "dgx_ndr_healthy.txt"), (b, a, "dgx_ndr_degraded.txt")):
            configs[n.name] = config(tmp_path, n, peer, tree)
            n.log = tmp_path / f"{n.name}.log"
            n.proc = subprocess.Popen(
                ["ip", "netns", "exec", n.netns, sys.executable, "-m", "dgxdoctor", "run", "--config",
                 str(configs[n.name])],
                env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                stdout=n.log.open("wb"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        for n in (a, b):
            _wait_healthy(n)
        yield a, b, configs
    finally:
        for n in (a, b):
            _stop(n)
        for n in (a, b):
            subprocess.run(["ip", "netns", "del", n.netns], capture_output=True)


def _wait_healthy(n: Node, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if json.loads(n.get("/healthz")).get("healthy"):
                return
        except (RuntimeError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{n.name} not healthy:\n{n.log.read_text() if n.log else ''}")


def _stop(n: Node) -> None:
    if n.proc is not None and n.proc.poll() is None:
        n.proc.terminate()
        try:
            n.proc.wait(15)
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.proc.wait(5)


def cli(n: Node, *args: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run(
        ["ip", "netns", "exec", n.netns, sys.executable, "-m", "dgxdoctor", *args],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=n.log.parent if n.log else None,
    )
    return done, time.monotonic() - t0


def test_check_cluster_from_either_node_then_the_peer_stopped(
    nodes: tuple[Node, Node, dict[str, Path]], tmp_path: Path
) -> None:
    a, b, configs = nodes
    single, single_s = cli(a, "check", "--config", str(configs["dgx-a"]))
    for me, other in ((a, b), (b, a)):
        done, took = cli(me, "check", "--cluster", "--json", "--config", str(configs[me.name]))
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
    table, _ = cli(a, "check", "--cluster", "--config", str(configs["dgx-a"]))
    assert "dgx-a" in table.stdout and "dgx-b" in table.stdout and "infiniband" in table.stdout
    assert single.returncode in (0, 1)  # dgx-a alone is not critical: the worst above was dgx-b's

    _stop(b)
    done, took = cli(a, "check", "--cluster", "--json", "--deadline", "5", "--config", str(configs["dgx-a"]))
    doc = json.loads(done.stdout)
    peer = next(n for n in doc["nodes"] if not n["local"])
    assert peer["status"] == "unknown" and peer["node"] == f"{b.ip}:{PORT}" and peer["error"]
    assert took < 5 + 4.0, took  # the deadline, plus starting Python
    local = Status(next(n for n in doc["nodes"] if n["local"])["status"])
    assert done.returncode == exit_code(Status.worst([local, Status.UNKNOWN]))


def test_bundle_cluster_has_both_parts_offsets_and_no_secret(
    nodes: tuple[Node, Node, dict[str, Path]], tmp_path: Path
) -> None:
    a, _, configs = nodes
    out = tmp_path / "cluster.tar.gz"
    done, _ = cli(a, "bundle", "--cluster", "--since", "1h", "--deadline", "60", "-o", str(out), "--config",
                  str(configs["dgx-a"]))  # fmt: skip
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
    everything = b"\n".join(files.values())
    for secret in (TOKEN, HF, URL_PASSWORD):
        assert secret.encode() not in everything, secret
    assert b"HF_TOKEN=<redacted>" in files["cluster/dgx-b/logs/vllm/vllm-dgx-b.log"]

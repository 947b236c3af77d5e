"""Two dgxdoctor daemons in two network namespaces ("nodes") joined by a veth pair compare each other; cutting
the link turns into a PEER_UNREACHABLE finding and peer_up 0 on both sides.

Each node reads its own sysfs InfiniBand tree (tests/fixtures/sysfs_ib): dgx-a the healthy one, dgx-b the degraded
one (a rail down, one at half rate), so the comparison has a real asymmetry to name.

Namespaces are named ``dgxd-peer-*``, use 10.78.0.0/24 and have no default route, so nothing leaves the machine.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO
from sysfstree import build_sysfs_tree

pytestmark = pytest.mark.integration

TOKEN = "two-node-token-0123456789"
PORT = 9835
FETCH = (
    "import sys, urllib.request as u\n"
    "r = u.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]})\n"
    "print(u.urlopen(r, timeout=5).read().decode())\n"
)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Node:
    name: str
    netns: str
    veth: str
    ip: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def get(self, path: str) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, sys.executable, "-c", FETCH, f"http://127.0.0.1:{PORT}{path}", TOKEN],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "fetch failed")
        return done.stdout


def can_make_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = f"dgxd-peer-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    reason = can_make_netns()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 100000
    a = Node("dgx-a", f"dgxd-peer-a-{tag}", f"dxa{tag}", "10.78.0.1")
    b = Node("dgx-b", f"dgxd-peer-b-{tag}", f"dxb{tag}", "10.78.0.2")
    try:
        for n in (a, b):
            sh("ip", "netns", "add", n.netns)
            sh("ip", "-n", n.netns, "link", "set", "lo", "up")
        sh("ip", "link", "add", a.veth, "netns", a.netns, "type", "veth", "peer", "name", b.veth, "netns", b.netns)
        for n in (a, b):
            sh("ip", "-n", n.netns, "addr", "add", f"{n.ip}/24", "dev", n.veth)
            sh("ip", "-n", n.netns, "link", "set", n.veth, "up")
        for n, peer, tree in ((a, b, "dgx_ndr_healthy.txt"), (b, a, "dgx_ndr_degraded.txt")):
            sysfs = build_sysfs_tree(tmp_path / f"sysfs-{n.name}", tree)
            config = tmp_path / f"{n.name}.toml"
            config.write_text(
                f'node = "{n.name}"\n'
                f'[paths]\nstate_dir = "{tmp_path / n.name}"\nsysfs_root = "{sysfs}"\n'
                f'[daemon]\nlisten = "0.0.0.0:{PORT}"\ntoken = "{TOKEN}"\n'
                f'peers = ["http://{peer.ip}:{PORT}"]\npeer_timeout_s = 1.0\n'
                f"[checks.peer_compare]\ninterval_s = 1.0\n"
            )
            n.log = tmp_path / f"{n.name}.log"
            n.proc = subprocess.Popen(
                ["ip", "netns", "exec", n.netns, sys.executable, "-m", "dgxdoctor", "run", "--config", str(config)],
                env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                stdout=n.log.open("wb"),
                stderr=subprocess.STDOUT,
            )
        yield a, b
    finally:
        for n in (a, b):
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()
                try:
                    n.proc.wait(15)
                except subprocess.TimeoutExpired:
                    n.proc.kill()
                    n.proc.wait(5)
        for n in (a, b):
            subprocess.run(["ip", "netns", "del", n.netns], capture_output=True)


def wait_for_series(node: Node, series: str, limit_s: float = 60.0) -> str:
    deadline = time.monotonic() + limit_s
    last = ""
    while time.monotonic() < deadline:
        try:
            last = node.get("/metrics")
        except RuntimeError as exc:
            last = str(exc)
        if series in last:
            return last
        time.sleep(0.3)
    log = node.log.read_text() if node.log else ""
    raise AssertionError(f"{node.name}: no {series!r} within {limit_s} s\n--- last scrape:\n{last}\n--- log:\n{log}")


def test_two_nodes_see_each_other_then_the_cut(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    wait_for_series(a, 'dgxdoctor_peer_up{node="dgx-a",peer="10.78.0.2:9835"} 1.0')
    wait_for_series(b, 'dgxdoctor_peer_up{node="dgx-b",peer="10.78.0.1:9835"} 1.0')
    # dgx-b's degraded rails are a hardware difference between the nodes. Two nodes have no majority: the finding
    # names neither and gives both values (fleet/compare.py).
    deadline = time.monotonic() + 60
    while True:
        compare = next(c for c in json.loads(a.get("/state"))["checks"] if c["name"] == "peer_compare")
        drift = [f for f in compare["findings"] if f["code"] == "PEER_HARDWARE_DRIFT"]
        if drift or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert "1/1 peer(s) answered" in compare["summary"]
    assert drift and {f["subject"] for f in drift} == {None}, compare
    assert any(f["message"].startswith("the nodes disagree on ib_active_port_count: dgx-a ") for f in drift), drift
    # The status page lists each difference once (before: under each node's peer_compare and between the nodes).
    page = a.get("/")
    for f in drift:
        assert page.count(html.escape(f["message"])) == 1, f["message"]

    sh("ip", "-n", a.netns, "link", "set", a.veth, "down")  # cut the link between the nodes

    for node, peer in ((a, b), (b, a)):
        text = wait_for_series(node, f'dgxdoctor_peer_up{{node="{node.name}",peer="{peer.ip}:{PORT}"}} 0.0')
        assert f'dgxdoctor_check_status{{check="peer_compare",node="{node.name}"}} 1.0' in text
        doc = json.loads(node.get("/state"))
        compare = next(c for c in doc["checks"] if c["name"] == "peer_compare")
        codes = [(f["code"], f["subject"]) for f in compare["findings"]]
        assert codes == [("PEER_UNREACHABLE", f"{peer.ip}:{PORT}")], codes
    for n in (a, b):
        assert n.proc is not None and n.proc.poll() is None, f"{n.name} exited"

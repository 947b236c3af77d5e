"""Two dgxdoctor daemons on the multi-node harness (tests/harness: each node in its own network and PID namespace)
compare each other; cutting the link between them turns into a PEER_UNREACHABLE finding and peer_up 0 on both
sides.

Each node reads its own sysfs InfiniBand tree (tests/fixtures/sysfs_ib): dgx-a the healthy one, dgx-b the degraded
one (a rail down, one at half rate), so the comparison has a real asymmetry to name. The cut isolates the nodes'
bridge ports from each other; the host (the test, as Prometheus would) still reaches both.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import PORT, Cluster, Node, wait_for
from sysfstree import build_sysfs_tree

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster({"dgx-a": None, "dgx-b": None}) as made:
        for name, tree in (("dgx-a", "dgx_ndr_healthy.txt"), ("dgx-b", "dgx_ndr_degraded.txt")):
            sysfs = build_sysfs_tree(tmp_path / f"sysfs-{name}", tree)
            made[name].configure(extra={"paths": {"sysfs_root": str(sysfs)}, "daemon": {"peer_timeout_s": 1.0},
                                        "checks.peer_compare": {"interval_s": 1.0}})  # fmt: skip
        made.start_daemons()
        yield made


def peer_up(node: Node, peer: Node) -> float | None:
    return node.sample("dgxdoctor_peer_up", peer=f"{peer.name}:{PORT}")


def test_two_nodes_see_each_other_then_the_cut(cluster: Cluster) -> None:
    a, b = cluster["dgx-a"], cluster["dgx-b"]
    wait_for("dgx-a sees dgx-b", lambda: peer_up(a, b) == 1.0, 60, a)
    wait_for("dgx-b sees dgx-a", lambda: peer_up(b, a) == 1.0, 60, b)
    # dgx-b's degraded rails are a hardware difference between the nodes. Two nodes have no majority: the finding
    # names neither and gives both values (fleet/compare.py).
    drift = wait_for("the hardware drift", lambda: [f for f in a.findings("peer_compare")
                                                    if f["code"] == "PEER_HARDWARE_DRIFT"], 60, a)  # fmt: skip
    compare = a.checks()["peer_compare"]
    assert "1/1 peer(s) answered" in compare["summary"]
    assert {f["subject"] for f in drift} == {None}, compare
    assert any(f["message"].startswith("the nodes disagree on ib_active_port_count: dgx-a ") for f in drift), drift
    # The status page lists each difference once (before: under each node's peer_compare and between the nodes).
    page = a.get("/", auth=True).text
    for f in drift:
        assert page.count(html.escape(f["message"])) == 1, f["message"]

    cluster.network.isolate()  # cut the link between the nodes

    for node, peer in ((a, b), (b, a)):
        wait_for(f"{node.name}: peer_up 0", lambda n=node, p=peer: peer_up(n, p) == 0.0, 60, node)
        assert node.sample("dgxdoctor_check_status", check="peer_compare") == 1.0
        codes = [(f["code"], f["subject"]) for f in node.findings("peer_compare")]
        # dgx-b's rail down is a hardware cause: dgx-a keeps relaying it from dgx-b's last answer while dgx-b does
        # not answer (a restart must not slip through while the peer is silent), dgx-b has none of dgx-a's to keep.
        kept = [("PEER_HARDWARE_FAULT", f"{peer.name}:{PORT}")] if peer is b else []
        assert codes == [("PEER_UNREACHABLE", f"{peer.name}:{PORT}"), *kept], codes
    for n in (a, b):
        assert n.daemon is not None and n.daemon.alive(), f"{n.name} exited"

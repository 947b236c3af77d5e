"""Who differs, decided once: two nodes that differ disagree (nobody is "the odd node"), and the odd node is named
only where a strict majority of three or more nodes agree (issue 33, row 4).

Every node's document is built as its daemon builds ``/state`` (``ResultsDocument.of``), sent as JSON bytes over
HTTP (an httpx transport at the network boundary), fetched and validated by ``fleet/peers.py`` and compared by the
``peer_compare`` check, from each node's side in turn. The status page and ``check --cluster`` then render those
nodes' documents, each with its own ``peer_compare`` result, as they do in the daemon. Before the fix dgx-a's agent
said "dgx-b differs from the rest", dgx-b's "dgx-a differs from the rest", and the page listed each difference three
times.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from dgxdoctor.checks.gpu import UTILIZATION
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.daemon.page import render_page
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.fleet.cluster import NodeRun, assemble, cluster_document
from dgxdoctor.fleet.cluster_table import cluster_table
from dgxdoctor.fleet.peers import response_json, validated_document
from dgxdoctor.result import CheckResult, Finding, Sample, Status
from dgxdoctor.validation import validate

TOKEN = "compare-verdict-token-0123456789"
SHARD = "model_shard_sha256.model-00001-of-00004.safetensors"
GOOD_SHARD = "9f2c1e6a0d3b4c5e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e"
BAD_SHARD = "00aa11bb22cc33dd44ee55ff66aa77bb88cc99dd00ee11ff22aa33bb44cc55dd"


def url(node: str) -> str:
    return f"http://{node}:9835"


def serving(node: str, shard: str, gid: str, python: str) -> list[CheckResult]:
    """A node's drift and nccl_env results, with the facts under the names those checks give them."""
    drift = CheckResult("drift", Status.OK, f"known: python_version {python}",
                        facts={SHARD: shard, "python_version": python, "vllm_version": "0.11.0"})  # fmt: skip
    env = CheckResult("nccl_env", Status.OK, "NCCL environment read",
                      facts={"nccl_env.NCCL_IB_GID_INDEX": gid, "nccl_env.NCCL_IB_HCA": "mlx5_0,mlx5_1",
                             "nccl_env.VLLM_HOST_IP": f"10.0.0.{len(node)}"})  # fmt: skip
    return [drift, env]


def wire(node: str, results: list[CheckResult]) -> bytes:
    return json.dumps(ResultsDocument.of(node, results, time.time()).state()).encode()


def peer_compare(me: str, nodes: dict[str, list[CheckResult]]) -> CheckResult:
    """``me``'s peer_compare check as its daemon runs it: its own document, every other node's /state fetched over
    HTTP with the token and validated by fleet/peers.py."""
    bodies = {url(n).split("//")[1].split(":")[0]: wire(n, r) for n, r in nodes.items() if n != me}

    def serve(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/state" and request.headers["authorization"] == f"Bearer {TOKEN}"
        return httpx.Response(200, content=bodies[request.url.host], headers={"Content-Type": "application/json"})

    local = ResultsDocument.of(me, nodes[me], time.time()).state()
    peers = Peers(tuple(url(n) for n in nodes if n != me), TOKEN, 5.0)
    fleet = Fleet(local_state=lambda without: local, peers=lambda: peers)
    env = Environment(node=me, http_transport=httpx.MockTransport(serve), one_shot=False, fleet=fleet)
    return PeerCompareCheck(validate(PeerCompareSettings, {}), env).run()


def drift_findings(result: CheckResult) -> list[Finding]:
    return [f for f in result.findings if f.code.startswith("PEER_") and f.code != "PEER_UNREACHABLE"]


TWO = {
    "dgx-a": serving("dgx-a", GOOD_SHARD, "3", "3.12.3"),
    "dgx-b": serving("dgx-b", BAD_SHARD, "0", "3.10.12"),
}


def test_two_nodes_that_differ_disagree_and_both_agents_say_the_same() -> None:
    from_a, from_b = peer_compare("dgx-a", TWO), peer_compare("dgx-b", TWO)
    said_a, said_b = drift_findings(from_a), drift_findings(from_b)
    assert said_a == said_b  # one verdict, whichever node compares
    assert {(f.code, f.subject) for f in said_a} == {
        ("PEER_MODEL_MISMATCH", None),
        ("PEER_NCCL_ENV_DRIFT", None),
        ("PEER_VERSION_SKEW", None),
    }
    by_code = {f.code: f for f in said_a}
    assert by_code["PEER_MODEL_MISMATCH"].message == (
        f"the nodes disagree on {SHARD}: dgx-a {GOOD_SHARD}, dgx-b {BAD_SHARD}"
    )
    gid = "the nodes disagree on nccl_env.NCCL_IB_GID_INDEX: dgx-a 3, dgx-b 0"
    assert by_code["PEER_NCCL_ENV_DRIFT"].message == gid
    assert by_code["PEER_VERSION_SKEW"].message == "the nodes disagree on python_version: dgx-a 3.12.3, dgx-b 3.10.12"
    assert all("differs from the rest" not in f.message and f.remedy for f in said_a)
    assert by_code["PEER_MODEL_MISMATCH"].status is Status.CRITICAL


def page_and_table(nodes: dict[str, list[CheckResult]]) -> tuple[str, str, dict[str, Any]]:
    """The status page of the first node and `check --cluster --cached` there: every node's /state document (each
    with its own peer_compare result), the peers' validated as fleet/cluster.py does, assembled and rendered."""
    docs = {n: [*r, peer_compare(n, nodes)] for n, r in nodes.items()}
    first, *rest = docs
    local = NodeRun(first, None, ResultsDocument.of(first, docs[first], time.time()).state())
    peers = [NodeRun(n, url(n), validated_document(response_json(wire(n, docs[n]))).state()) for n in rest]
    view = assemble(local, peers)
    return render_page(view, None), cluster_table(view), cluster_document(view)


def test_the_page_and_the_cluster_table_list_each_disagreement_once() -> None:
    html, table, doc = page_and_table(TWO)
    for text in (
        f"the nodes disagree on {SHARD}: dgx-a {GOOD_SHARD}, dgx-b {BAD_SHARD}",
        "the nodes disagree on nccl_env.NCCL_IB_GID_INDEX: dgx-a 3, dgx-b 0",
        "the nodes disagree on python_version: dgx-a 3.12.3, dgx-b 3.10.12",
    ):
        assert html.count(text) == 1, text
        assert table.replace("\n    ", " ").count(text) == 1, text
    assert "differs from the rest" not in html and "differs from the rest" not in table
    # Listed under "Between the nodes", with its own remedy; "What is wrong" leaves the comparison to it.
    between = html.split("<h2>Between the nodes</h2>")[1].split("<h2>")[0]
    assert "PEER_MODEL_MISMATCH" in between and "same weights from the same path" in between
    assert "· peer_compare" not in html
    assert doc["comparison"]["drifts"] == [
        {"fact": SHARD, "values": {"dgx-a": GOOD_SHARD, "dgx-b": BAD_SHARD}, "odd": []},
        {"fact": "nccl_env.NCCL_IB_GID_INDEX", "values": {"dgx-a": "3", "dgx-b": "0"}, "odd": []},
        {"fact": "python_version", "values": {"dgx-a": "3.12.3", "dgx-b": "3.10.12"}, "odd": []},
    ]


def test_three_nodes_two_agreeing_name_the_odd_one() -> None:
    three = {
        "dgx-a": serving("dgx-a", GOOD_SHARD, "3", "3.12.3"),
        "dgx-b": serving("dgx-b", GOOD_SHARD, "3", "3.12.3"),
        "dgx-c": serving("dgx-c", BAD_SHARD, "3", "3.12.3"),
    }
    verdicts = [drift_findings(peer_compare(n, three)) for n in three]
    assert verdicts[0] == verdicts[1] == verdicts[2]
    [mismatch] = verdicts[0]
    assert (mismatch.code, mismatch.subject) == ("PEER_MODEL_MISMATCH", "dgx-c")
    majority = f"where the other 2 nodes (dgx-a, dgx-b) have {GOOD_SHARD}"
    assert mismatch.message == f"{SHARD}: dgx-c has {BAD_SHARD} {majority}"
    html, table, doc = page_and_table(three)
    assert html.count(mismatch.message) == 1 and table.replace("\n    ", " ").count(mismatch.message) == 1
    assert doc["comparison"]["drifts"] == [
        {"fact": SHARD, "values": {"dgx-a": GOOD_SHARD, "dgx-b": GOOD_SHARD, "dgx-c": BAD_SHARD}, "odd": ["dgx-c"]}
    ]


def test_three_nodes_all_different_have_no_majority() -> None:
    three = {
        "dgx-a": serving("dgx-a", GOOD_SHARD, "3", "3.12.3"),
        "dgx-b": serving("dgx-b", GOOD_SHARD, "0", "3.12.3"),
        "dgx-c": serving("dgx-c", GOOD_SHARD, "1", "3.12.3"),
    }
    [drift] = drift_findings(peer_compare("dgx-b", three))
    assert (drift.code, drift.subject) == ("PEER_NCCL_ENV_DRIFT", None)
    assert drift.message == "the nodes disagree on nccl_env.NCCL_IB_GID_INDEX: dgx-a 3, dgx-b 0, dgx-c 1"


def test_without_a_comparison_here_a_nodes_own_verdict_stays_under_it() -> None:
    """The page could not read dgx-b just now, but dgx-a's peer_compare did: its findings stay under dgx-a."""
    mine = [*TWO["dgx-a"], peer_compare("dgx-a", TWO)]
    local = NodeRun("dgx-a", None, ResultsDocument.of("dgx-a", mine, time.time()).state())
    view = assemble(local, [NodeRun("dgx-b:9835", url("dgx-b"), None, "ConnectError: connection refused")])
    html, table = render_page(view, None), cluster_table(view)
    gid = "the nodes disagree on nccl_env.NCCL_IB_GID_INDEX: dgx-a 3, dgx-b 0"
    assert html.count(gid) == 1 and "· peer_compare" in html
    assert table.replace("\n    ", " ").count(gid) == 1


def busy(util: float) -> list[CheckResult]:
    """A gpu check's utilisation samples, eight GPUs at ``util``."""
    samples = tuple(Sample(UTILIZATION, util, {"gpu": str(i), "pci_bus_id": f"0000:{i:02x}:00"}) for i in range(8))
    return [CheckResult("gpu", Status.OK, "8 GPUs", samples=samples)]


def test_an_imbalance_names_every_node_on_the_side_that_hurts_the_same_from_each_node() -> None:
    """Two nodes idle while one serves: both are named, not the first of two equals (before: dgx-b alone)."""
    two_idle = {"dgx-a": busy(0.9), "dgx-b": busy(0.05), "dgx-c": busy(0.05)}
    said = [[f for f in peer_compare(n, two_idle).findings if f.code == "PEER_GPU_UTILIZATION_IMBALANCE"]
            for n in two_idle]  # fmt: skip
    assert said[0] == said[1] == said[2]
    assert [f.subject for f in said[0]] == ["dgx-b,dgx-c"]
    assert "dgx-b 0.05, dgx-c 0.05 vs dgx-a 0.90" in said[0][0].message
    one_idle = {"dgx-a": busy(0.9), "dgx-b": busy(0.85), "dgx-c": busy(0.05)}
    found = [f for f in peer_compare("dgx-a", one_idle).findings if f.code == "PEER_GPU_UTILIZATION_IMBALANCE"]
    assert [f.subject for f in found] == ["dgx-c"]
    # Two nodes: the idle one, named the same from both sides.
    pair = {"dgx-a": busy(0.95), "dgx-b": busy(0.02)}
    assert [(f.code, f.subject) for f in drift_findings(peer_compare("dgx-b", pair))] == [
        ("PEER_GPU_UTILIZATION_IMBALANCE", "dgx-b")
    ]

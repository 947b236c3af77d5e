"""Agents of two releases side by side (issue 34): a peer's results document of the previous release (schema 1, no
version) or of a newer one (schema 3) is fetched over HTTP, validated by fleet/peers.py and compared by the
peer_compare check as the daemon runs it. The peer answers and is compared; the release difference is one
PEER_VERSION_SKEW warning naming both releases; nothing the old document leaves out is read as "nothing wrong".

The previous release's document is tests/fixtures/documents/state-85f803c.json, written by that release's code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from dgxdoctor import __version__
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.documents import SCHEMA, UNNUMBERED_SCHEMA, ResultsDocument
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.fleet import compare as compare_module
from dgxdoctor.fleet.cluster import NodeRun, assemble, cluster_document
from dgxdoctor.fleet.compare import compare
from dgxdoctor.fleet.peers import response_json, validate_state, validated_document
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.validation import validate

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "documents" / "state-85f803c.json"
TOKEN = "doc-versions-token-0123456789"
THIS = f"{__version__} (results schema {SCHEMA})"
EARLIER = "of an earlier release (results schema 1, which sends no version)"


def previous_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(PREVIOUS.read_text())
    return doc


def local_results() -> list[CheckResult]:
    drift = CheckResult("drift", Status.OK, "known", facts={"python_version": "3.11.7", "driver_version": "580.159.04"})
    return [drift]


def peer_compare(peer_body: bytes) -> CheckResult:
    """dgx-a's peer_compare as its daemon runs it, dgx-b answering ``peer_body`` over HTTP."""

    def serve(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/state" and request.headers["authorization"] == f"Bearer {TOKEN}"
        return httpx.Response(200, content=peer_body, headers={"Content-Type": "application/json"})

    local = ResultsDocument.of("dgx-a", local_results(), time.time()).state()
    peers = Peers(("http://dgx-b:9835",), TOKEN, 5.0)
    fleet = Fleet(local_state=lambda without: local, peers=lambda: peers)
    env = Environment(node="dgx-a", http_transport=httpx.MockTransport(serve), one_shot=False, fleet=fleet)
    return PeerCompareCheck(validate(PeerCompareSettings, {}), env).run()


def test_this_release_says_its_schema_and_version() -> None:
    doc = ResultsDocument.of("dgx-a", local_results(), 1.0).state()
    assert (doc["schema"], doc["agent_version"]) == (SCHEMA, __version__)
    assert compare_module.UNNUMBERED_SCHEMA == UNNUMBERED_SCHEMA  # the one meaning of "no schema sent"


def test_the_previous_release_document_is_read_with_what_it_lacks_unknown() -> None:
    doc = validated_document(previous_doc())
    assert (doc.schema, doc.agent_version, doc.newer_schema()) == (UNNUMBERED_SCHEMA, None, None)
    (xid,) = next(c for c in doc.checks if c.name == "xid").findings
    assert (xid.code, xid.evidence, xid.remedy, xid.action, xid.cure) == ("XID_79", None, None, None, None)


def test_a_previous_release_peer_answers_and_is_compared_with_a_version_warning() -> None:
    result = peer_compare(PREVIOUS.read_bytes())
    assert result.summary.startswith("1/1 peer(s) answered"), result.summary
    by_code = {f.code: f for f in result.findings}
    assert "PEER_UNREACHABLE" not in by_code
    skew = by_code["PEER_VERSION_SKEW"]
    assert skew.status is Status.WARNING and skew.subject is None
    runs = f"dgx-a runs dgxdoctor {THIS}, dgx-b runs dgxdoctor {EARLIER}"
    assert skew.message == f"the nodes run different releases: {runs}"
    # The old peer's XID 79 sends no cure: unknown, so it still gates this node's restarts (was ignored before).
    (fault,) = [f for f in result.findings if f.code == "PEER_HARDWARE_FAULT"]
    assert fault.message == "XID 79 on 0000:3b:00 of dgx-b"
    # Nothing critical comes of the version difference; the nodes' other facts are the same.
    assert [f.code for f in result.findings if f.status is Status.CRITICAL] == []
    assert result.status is Status.WARNING


def test_the_same_release_is_no_difference() -> None:
    body = json.dumps(ResultsDocument.of("dgx-b", local_results(), time.time()).state()).encode()
    result = peer_compare(body)
    assert result.status is Status.OK and result.findings == (), result.findings
    assert "PEER_VERSION_SKEW" not in {d.key for d in compare([validate_state(json.loads(body))]).drifts}


def test_a_newer_schema_is_read_for_what_is_known_and_said() -> None:
    doc = previous_doc()
    doc.update(schema=SCHEMA + 1, agent_version="9.0.0", hosts={"new": "key"})
    doc["checks"][0]["new_key"] = [1, 2]
    result = peer_compare(json.dumps(doc).encode())
    assert result.summary.startswith("1/1 peer(s) answered"), result.summary
    assert result.facts == {
        "peer_schema.dgx-b:9835": f"results schema {SCHEMA + 1} (dgxdoctor 9.0.0), newer than this agent's "
        f"{SCHEMA}: read for the keys schema {SCHEMA} has, the rest ignored"
    }
    skew = next(f for f in result.findings if f.code == "PEER_VERSION_SKEW")
    assert skew.message.endswith(f"dgx-b runs dgxdoctor 9.0.0 (results schema {SCHEMA + 1})")
    assert skew.status is Status.WARNING
    # A node's word on its peers is its own: never compared between the nodes.
    a = {"node": "a", "checks": [], "facts": {"peer_schema.b:9835": "x"}}
    b = {"node": "b", "checks": [], "facts": {"peer_schema.b:9835": "y"}}
    assert compare([a, b]).findings == ()


def test_check_cluster_and_the_page_compare_a_previous_release_peer() -> None:
    """`check --cluster` (and the status page, from the same view): the previous release's /check/run document,
    as fetched and validated, beside this node's; the release difference is one drift of the comparison."""
    local = NodeRun("dgx-a", None, ResultsDocument.of("dgx-a", local_results(), time.time()).state())
    peer = NodeRun("dgx-b", "http://dgx-b:9835", validated_document(response_json(PREVIOUS.read_bytes())).state())
    view = assemble(local, [peer])
    drift = cluster_document(view)["comparison"]["drifts"]
    assert [d["fact"] for d in drift] == ["dgxdoctor_version"], drift
    assert drift[0]["values"] == {"dgx-a": THIS, "dgx-b": EARLIER}
    assert [f.code for f in view.comparison.findings] == ["PEER_VERSION_SKEW"]
    assert view.nodes[1].status is not Status.UNKNOWN

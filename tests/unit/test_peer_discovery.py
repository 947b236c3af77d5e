"""Peers discovered (fleet/discovery.py): Ray's node table through the dashboard API (answers captured from a real
two-node Ray cluster, tests/fixtures/ray/SOURCES.md), a DNS name resolved for real, the static list; a failed
source keeps its last members, a node that leaves Ray is PEER_LEFT_RAY and stays a peer."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from conftest import FIXTURES
from dgxdoctor.checks.peer_compare import discovery_findings
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.discovery import Membership, Where, own_agent
from dgxdoctor.fleet.discovery import discover as discover_round
from dgxdoctor.sources.peer_sources import parse_prom_targets

RAY = FIXTURES / "ray"


def discover(*args: object) -> tuple[tuple[str, ...], tuple[object, ...]]:
    """A round of discovery as the daemon runs it: the peers, and what was seen judged as the peer comparison's
    findings."""
    peers, seen = discover_round(*args)  # type: ignore[arg-type]
    return peers, discovery_findings(seen)


ME = own_agent("10.77.0.1", 9835)


def dashboard(answers: list[str | int]) -> Callable[[], httpx.Client]:
    """A client whose dashboard answers the next of ``answers`` each round: a fixture's name, or a status code."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v0/nodes"
        answer = answers.pop(0)
        if isinstance(answer, int):
            return httpx.Response(answer, text="dashboard down")
        return httpx.Response(200, content=(RAY / f"{answer}-nodes-detail.json").read_bytes())

    return lambda: Environment(http_transport=httpx.MockTransport(handle)).http_client()


WHERE = Where(static=("http://static-peer:9835",), sources=("static", "ray"), ray_dashboard="http://10.77.0.1:8265")


def test_ray_members_kept_when_a_node_leaves_and_when_ray_fails() -> None:
    client = dashboard(["healthy", "dead", 503, "rejoined"])
    members = Membership()
    peers, found = discover(members, WHERE, ME, client)
    assert (peers, found) == (("http://static-peer:9835", "http://10.77.0.2:9835"), ())

    peers, found = discover(members, WHERE, ME, client)  # 10.77.0.2's raylet died
    assert peers == ("http://static-peer:9835", "http://10.77.0.2:9835")  # not a shorter list
    assert [(f.code, f.subject) for f in found] == [("PEER_LEFT_RAY", "10.77.0.2")]
    assert "missing too many heartbeats" in found[0].message

    peers, found = discover(members, WHERE, ME, client)  # the dashboard fails: Ray is the fault
    assert peers == ("http://static-peer:9835", "http://10.77.0.2:9835")
    assert [(f.code, f.subject) for f in found] == [("PEER_DISCOVERY_STALE", "ray")]
    assert "last known 2 member(s) kept" in found[0].message

    peers, found = discover(members, WHERE, ME, client)  # it rejoined (a new node id, the same address)
    assert (peers, found) == (("http://static-peer:9835", "http://10.77.0.2:9835"), ())


def test_a_dns_name_with_several_addresses() -> None:
    where = Where(sources=("dns",), dns_name="localhost", agent_port=9999)
    peers, found = discover(Membership(), where, own_agent("10.0.0.9", 9835), lambda: httpx.Client())
    assert found == ()
    assert "http://127.0.0.1:9999" in peers
    assert set(peers) <= {"http://127.0.0.1:9999", "http://[::1]:9999"}


def test_an_unresolvable_name_is_stale_not_empty() -> None:
    members = Membership()
    where = Where(sources=("dns",), dns_name="localhost", agent_port=9999)
    discover(members, where, ME, lambda: httpx.Client())
    gone = Where(sources=("dns",), dns_name="no-such-host.invalid", agent_port=9999)
    peers, found = discover(members, gone, ME, lambda: httpx.Client())
    assert "http://127.0.0.1:9999" in peers
    assert [f.code for f in found] == ["PEER_DISCOVERY_STALE"]


def test_prometheus_targets_of_the_job() -> None:
    payload = (
        '{"status":"success","data":{"activeTargets":['
        '{"labels":{"instance":"10.0.0.2:9835","job":"dgxdoctor"},"scrapeUrl":"http://10.0.0.2:9835/metrics"},'
        '{"labels":{"instance":"10.0.0.3:8000","job":"vllm"},"scrapeUrl":"http://10.0.0.3:8000/metrics"}]}}'
    )
    assert parse_prom_targets(payload, "dgxdoctor") == ("http://10.0.0.2:9835",)


def test_sources_are_validated() -> None:
    for fleet, problem in (
        ({"peer_sources": ["dns"]}, "needs dns_name"),
        ({"peer_sources": ["prometheus"]}, "needs prometheus_url"),
        ({"peer_sources": ["static", "static"]}, "listed twice"),
        ({"peer_sources": ["consul"]}, "consul"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config({"fleet": fleet})
        assert problem in str(err.value), err.value
    where = parse_config({"fleet": {"peer_sources": ["static", "ray"]}, "daemon": {"peers": ["http://b:9835"]}})
    assert where.peer_sources().ray_dashboard == "http://127.0.0.1:8265"

"""Serving groups: ``[node] group`` validated, carried on /state, on every finding and in dgxdoctor_node_info; the
comparison compares within a group and the groups with each other; an older agent's document (no group) is read as
the unknown group and still compared in a rolling upgrade."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.exporters.collector import exposition, make_registry
from dgxdoctor.fleet.compare import ACROSS_GROUPS, GROUP_IMBALANCE_CODE, compare, group_members
from dgxdoctor.fleet.peers import response_json, validated_document
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import DEFAULT_GROUP, UNKNOWN_GROUP, CheckResult, Finding, MetricSpec, Sample, Status

UTIL = MetricSpec("dgxdoctor_gpu_utilization_ratio", "utilisation", labels=("gpu",))


def test_the_group_is_validated() -> None:
    assert parse_config({"node": {"group": "glm-a"}}).group == "glm-a"
    assert parse_config({}).group == DEFAULT_GROUP
    for bad in ("", "unknown", "a b", "-x", "g" * 64, 'x"y'):
        with pytest.raises(ConfigError) as err:
            parse_config({"node": {"group": bad}})
        ((path, reason),) = err.value.problems
        assert path == "node" and reason.endswith("- at `$.node.group`"), (bad, reason)


def store(node: str, group: str, util: float, *findings: Finding) -> ResultStore:
    s = ResultStore(node, group=group)
    samples = (Sample(UTIL, util, {"gpu": "0"}),)
    s.put(CheckResult("gpu", Status.worst(f.status for f in findings), "gpu", tuple(findings), samples))
    return s


def over_the_wire(doc: dict[str, object]) -> ResultsDocument:
    return validated_document(response_json(json.dumps(doc).encode()))


def test_state_and_every_finding_carry_the_group() -> None:
    s = store("dgx-a", "glm-a", 0.9, Finding("XID_79", Status.CRITICAL, "fell off the bus", subject="0000:19:00.0"))
    doc = over_the_wire(s.snapshot())
    assert doc.group_name == "glm-a"
    assert [f.group for c in doc.checks for f in c.findings] == ["glm-a"]
    assert doc.compared()["group"] == "glm-a"


def test_an_older_document_is_the_unknown_group() -> None:
    doc = store("dgx-b", "x", 0.9).snapshot()
    del doc["group"]
    assert over_the_wire(doc).group_name == UNKNOWN_GROUP


def test_node_info_and_finding_series() -> None:
    s = store("dgx-a", "glm-a", 0.9, Finding("XID_79", Status.CRITICAL, "a message never in a label", subject="p0"))
    text = exposition(make_registry(s)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [x.labels for x in families["dgxdoctor_node_info"].samples] == [{"node": "dgx-a", "group": "glm-a"}]
    finding = families["dgxdoctor_finding_info"].samples
    assert [x.labels for x in finding] == [
        {"node": "dgx-a", "check": "gpu", "code": "XID_79", "subject": "p0", "status": "critical"}
    ]
    assert "never in a label" not in text


def test_finding_series_are_bounded() -> None:
    many = [Finding(f"XID_{i}", Status.WARNING, "m", subject=f"gpu{i}") for i in range(100)]
    s = store("dgx-a", "g", 0.9, Finding("XID_79", Status.CRITICAL, "m", subject="s" * 500), *many)
    families = {f.name: f for f in text_string_to_metric_families(exposition(make_registry(s)).decode())}
    rows = families["dgxdoctor_finding_info"].samples
    assert len(rows) == 64
    assert any(r.labels["code"] == "XID_79" and len(r.labels["subject"]) == 128 for r in rows)  # the worst kept


def snapshots(*nodes: tuple[str, str, float]) -> list[dict[str, object]]:
    return [over_the_wire(store(n, g, u).snapshot()).compared() for n, g, u in nodes]


def test_nodes_are_compared_within_their_group() -> None:
    """n3 idles in its own group of one: no node finding; within glm-a, n2 is the odd node."""
    outcome = compare(snapshots(("n1", "glm-a", 0.9), ("n2", "glm-a", 0.1), ("n3", "glm-b", 0.0)))
    node_findings = [f for f in outcome.findings if f.code == "PEER_GPU_UTILIZATION_IMBALANCE"]
    assert [f.subject for f in node_findings] == ["n2"]
    assert node_findings[0].message.startswith("serving group glm-a: ")
    across = [f for f in outcome.findings if f.code == GROUP_IMBALANCE_CODE]
    assert [f.subject for f in across] == ["glm-b"]  # glm-a's mean 0.5 against glm-b's 0
    assert {i.group for i in outcome.imbalances} == {"glm-a", ACROSS_GROUPS}


def test_an_older_peer_joins_the_one_group_there_is() -> None:
    """A rolling upgrade: the old agent sends no group; with one group it is compared there (the version skew of
    test_rolling_upgrade); beside two groups it is a group of its own."""
    docs = snapshots(("dgx-a", DEFAULT_GROUP, 0.9), ("dgx-b", DEFAULT_GROUP, 0.1))
    docs[1] = {k: v for k, v in docs[1].items() if k != "group"}
    assert list(group_members(docs)) == [DEFAULT_GROUP]
    assert [f.subject for f in compare(docs).findings if f.code == "PEER_GPU_UTILIZATION_IMBALANCE"] == ["dgx-b"]
    docs.append(snapshots(("dgx-c", "other", 0.5))[0])
    assert list(group_members(docs)) == [DEFAULT_GROUP, "other", UNKNOWN_GROUP]


def test_the_same_verdict_whoever_compares() -> None:
    docs = snapshots(("n1", "a", 0.9), ("n2", "a", 0.2), ("n3", "b", 0.8), ("n4", "b", 0.85))
    first = compare(docs).findings
    assert compare(list(reversed(docs))).findings == first

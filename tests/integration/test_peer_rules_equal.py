"""One comparison, two engines: the mesh's (``fleet.compare``, every agent comparing its peers' ``/state``) and the
shipped rules (``alerts.peer_rules``, Prometheus comparing every node it scrapes) name the same nodes and the same
serving groups.

Each scenario is a fleet of nodes in serving groups with random readings of every compared metric (some nodes
without some metrics, values around each rule's floor). Each node's readings go through the real path twice: into a
result store whose ``/state`` document the mesh compares, and out of the same store's exposition (the real
collector: ``dgxdoctor_node_info`` and the metric families) into ``promtool test rules``, which evaluates the
shipped recording rules and each alert's condition. The mesh's verdict (``fleet.compare.odd_ones`` over the
imbalances it computed, the same verdict as its findings) must equal the rules' series, node for node and group for
group.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from dgxdoctor.alerts.peer_rules import odd_member_expr
from dgxdoctor.exporters.collector import exposition, make_registry
from dgxdoctor.fleet.compare import ACROSS_GROUPS, GROUP_IMBALANCE_CODE, RULES, Rule, compare, odd_ones
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, MetricSpec, Sample, Status

pytestmark = pytest.mark.integration

RULES_FILE = REPO / "src" / "dgxdoctor" / "alerts" / "peer_compare.rules.yml"
RAILS = ("mlx5_0/1", "mlx5_1/1")

Member = tuple[str, str, str]  # (node or group, group or "", rail or "")


def spec(rule: Rule) -> MetricSpec:
    labels = ("device", "port") if rule.per_rail else ("gpu",)
    return MetricSpec(rule.metric, "a compared metric", labels=labels)


def readings(rng: random.Random, rule: Rule) -> list[Sample]:
    """A node's samples of one rule's metric: one to three GPUs, or the rails; values from 0 to 3x the floor."""
    if rule.per_rail:
        return [Sample(spec(rule), rng.uniform(0, 3 * rule.floor), {"device": r.split("/")[0], "port": "1"})
                for r in RAILS]  # fmt: skip
    return [Sample(spec(rule), rng.uniform(0, 3 * rule.floor), {"gpu": str(g)}) for g in range(rng.randint(1, 3))]


def fleet(seed: int) -> dict[str, tuple[str, ResultStore]]:
    """node -> (group, its store holding one result with every reading): 3 groups of 1 to 4 nodes."""
    rng = random.Random(seed)
    out = {}
    for g in range(3):
        for i in range(rng.randint(1, 4)):
            node = f"n{g}{i}"
            samples = [s for rule in RULES if rng.random() < 0.9 for s in readings(rng, rule)]
            store = ResultStore(node, group=f"grp-{g}")
            store.put(CheckResult("probe", Status.OK, "readings", samples=tuple(samples)))
            out[node] = (f"grp-{g}", store)
    return out


def mesh_verdict(stores: dict[str, tuple[str, ResultStore]]) -> dict[str, set[Member]]:
    """Per rule key, the members the mesh names: nodes within their group, and groups (``rule.key + "*"``)."""
    groups = {node: group for node, (group, _) in stores.items()}
    outcome = compare([store.snapshot() for _, store in stores.values()])
    rules = {rule.key: rule for rule in RULES}
    out: dict[str, set[Member]] = {key: set() for rule in RULES for key in (rule.key, rule.key + ACROSS_GROUPS)}
    for imbalance in outcome.imbalances:
        rule = rules[imbalance.key]
        for member in odd_ones(imbalance.values, rule, rule.tolerance):
            if imbalance.group == ACROSS_GROUPS:
                out[rule.key + ACROSS_GROUPS].add((member, "", imbalance.rail))
            else:
                out[rule.key].add((member, groups[member], imbalance.rail))
    # The findings say the same: every node named by a finding of the rule's code is in the verdict.
    for finding in outcome.findings:
        rule = next((r for r in RULES if r.code == finding.code), None)
        if rule is not None and finding.subject:
            nodes, _, rail = finding.subject.partition(" ")
            assert {(n, groups[n], rail) for n in nodes.split(",")} <= out[rule.key], finding
    odd_groups = {m for key, members in out.items() if key.endswith(ACROSS_GROUPS) for m, _, _ in members}
    for finding in outcome.findings:
        if finding.code == GROUP_IMBALANCE_CODE:
            assert set(str(finding.subject).split(",")) <= odd_groups, finding
    return out


def series(stores: dict[str, tuple[str, ResultStore]]) -> Iterator[dict[str, str]]:
    """promtool input series: every family each node's real exposition holds, each value held for 5 minutes."""
    for _, store in stores.values():
        for family in text_string_to_metric_families(exposition(make_registry(store)).decode()):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                yield {"series": f"{sample.name}{{{labels}}}", "values": f"{sample.value!r}x5"}


def rules_test(rule: Rule, across: bool, members: set[Member]) -> dict[str, object]:
    """The alert condition of ``rule`` as a promql test: the members it must return, each as 1."""
    samples = []
    for member, group, rail in sorted(members):
        labels = {"group": member} if across else {"node": member, "group": group}
        if rail:
            labels |= dict(zip(("device", "port"), rail.split("/"), strict=True))
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        samples.append({"labels": f"{{{text}}}", "value": 1})
    return {"expr": f"({odd_member_expr(rule, rule.tolerance, across)}) > bool 0", "eval_time": "2m",
            "exp_samples": samples}  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_the_mesh_and_the_rules_name_the_same_nodes_and_groups(tmp_path: Path, seed: int) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    stores = fleet(seed)
    verdict = mesh_verdict(stores)
    tests = [rules_test(rule, across, verdict[rule.key + (ACROSS_GROUPS if across else "")])
             for rule in RULES for across in (False, True)]  # fmt: skip
    doc = {"rule_files": [str(RULES_FILE)], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": list(series(stores)), "promql_expr_test": tests}]}  # fmt: skip
    path = tmp_path / "equal.yml"
    path.write_text(json.dumps(doc))
    done = subprocess.run([tool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert sum(map(len, verdict.values())) > 0, "a scenario where nothing is odd tests nothing"

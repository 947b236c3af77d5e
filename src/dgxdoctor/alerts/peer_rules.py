"""Prometheus recording rules that do the peer comparison for clusters past a handful of nodes.

The same metrics and aggregations as ``fleet.compare.RULES``, computed by Prometheus over every node it
scrapes. Two sets:

* by serving group, the mesh's own verdict (``fleet.compare.odd_ones``) in PromQL: each node's value (joined with
  ``dgxdoctor_node_info`` for its group), the best and worst of its group, and how far the node is off the best in
  the direction that hurts, ``(max - node) / max`` or ``(node - min) / node``; the same over the groups, each
  group's value the mean of its nodes'. The alert rules (``alert_rules.asymmetry_alerts``) compare these with the
  table's tolerances and floors, so a node the mesh names is a node the rules name
  (``tests/integration/test_peer_rules_equal.py``);
* the cluster median and each node's deviation from it, ``(node - median) / median``, which the dashboards plot.

Regenerate the shipped file with
``python -m dgxdoctor.alerts.peer_rules > src/dgxdoctor/alerts/peer_compare.rules.yml``.
"""

from __future__ import annotations

import json
import sys

from dgxdoctor.fleet.compare import RULES, Rule

_PROMQL_AGG = {"sum": "sum", "mean": "avg", "max": "max"}
# Keeps a zero median from dividing by zero; a node busy while the median node idles shows a huge deviation.
_EPSILON = "1e-12"


def rule_names(rule: Rule) -> tuple[str, str, str]:
    """The recorded series of one compared metric: (per node or rail, cluster median, deviation ratio)."""
    agg = _PROMQL_AGG[rule.aggregate]
    node, cluster = ("node_rail", "cluster_rail") if rule.per_rail else ("node", "cluster")
    return (
        f"{node}:{rule.metric}:{agg}",
        f"{cluster}:{rule.metric}:median",
        f"{node}:{rule.metric}:deviation_ratio",
    )


def _rules_for(rule: Rule) -> list[tuple[str, str]]:
    agg = _PROMQL_AGG[rule.aggregate]
    per_node, median, deviation = rule_names(rule)
    if rule.per_rail:
        by, match = "node, device, port", "on(device, port) group_left()"
        median_expr = f"quantile by (device, port) (0.5, {per_node})"
    else:
        by, match = "node", "on() group_left()"
        median_expr = f"quantile(0.5, {per_node})"
    return [
        (per_node, f"{agg} by ({by}) ({rule.metric})"),
        (median, median_expr),
        (deviation, f"({per_node} - {match} {median}) / {match} clamp_min({median}, {_EPSILON})"),
    ]


# One series per node carries its serving group (exporters.collector.NODE_INFO); ``topk`` keeps one per node should
# two agents claim the same name, so a join never fails for "many-to-many matching".
NODE_INFO = "dgxdoctor_node_info"
GROUP_INFO = f"topk by (node) (1, {NODE_INFO})"


def group_names(rule: Rule) -> dict[str, str]:
    """The recorded series of one compared metric by serving group (names in the table of the module docstring)."""
    agg = _PROMQL_AGG[rule.aggregate]
    m = rule.metric
    return {
        "node": f"node_group:{m}:{agg}",
        "group_max": f"group:{m}:max",
        "group_min": f"group:{m}:min",
        "node_off": f"node_group:{m}:off_best_ratio",
        "group_mean": f"group:{m}:mean",
        "fleet_max": f"fleet:{m}:group_max",
        "fleet_min": f"fleet:{m}:group_min",
        "group_off": f"group:{m}:off_best_ratio",
    }


def rail_labels(rule: Rule) -> str:
    return "device, port" if rule.per_rail else ""


def _by(*labels: str) -> str:
    return ", ".join(label for label in labels if label)


def _off_best(rule: Rule, member: str, best: str, worst: str, on: str) -> str:
    """How far a member (a node in its group, a group in the fleet) is off the best one, in the direction that hurts:
    ``fleet.compare._bad_side``'s ``(top - v) / top`` for a metric whose low side is bad, ``(v - low) / v`` for a
    high side."""
    match = f"on({on})"
    if rule.bad == "low":
        return f"1 - {member} / {match} group_left() clamp_min({best}, {_EPSILON})"
    return f"1 - ({worst} / {match} group_right() clamp_min({member}, {_EPSILON}))"


def _group_rules_for(rule: Rule) -> list[tuple[str, str]]:
    n = group_names(rule)
    rails = rail_labels(rule)
    in_group, in_fleet = _by("group", rails), _by(rails)
    joined = f"{rule.metric} * on(node) group_left(group) {GROUP_INFO}"
    agg = _PROMQL_AGG[rule.aggregate]
    return [
        (n["node"], f"{agg} by ({_by('node', 'group', rails)}) ({joined})"),
        (n["group_max"], f"max by ({in_group}) ({n['node']})"),
        (n["group_min"], f"min by ({in_group}) ({n['node']})"),
        (n["node_off"], _off_best(rule, n["node"], n["group_max"], n["group_min"], in_group)),
        (n["group_mean"], f"avg by ({in_group}) ({n['node']})"),
        (n["fleet_max"], f"max by ({in_fleet}) ({n['group_mean']})" if rails else f"max({n['group_mean']})"),
        (n["fleet_min"], f"min by ({in_fleet}) ({n['group_mean']})" if rails else f"min({n['group_mean']})"),
        (n["group_off"], _off_best(rule, n["group_mean"], n["fleet_max"], n["fleet_min"], in_fleet)),
    ]


def odd_member_expr(rule: Rule, tolerance: float, across: bool) -> str:
    """The members the mesh names (``fleet.compare.odd_ones``): off the best by more than the tolerance, the best
    (low side) or the member itself (high side) at the rule's floor or above. ``across``: groups in the fleet, else
    nodes in their group. Its value is how far off the best the member is."""
    n = group_names(rule)
    rails = rail_labels(rule)
    member, best, off = (
        (n["group_mean"], n["fleet_max"], n["group_off"]) if across else (n["node"], n["group_max"], n["node_off"])
    )
    on = _by(rails) if across else _by("group", rails)
    floor = f"on({on}) ({best} >= {rule.floor!r})" if rule.bad == "low" else f"{member} >= {rule.floor!r}"
    return f"{off} > {tolerance!r} and {floor}"


def render() -> str:
    lines = [
        "# Generated by `python -m dgxdoctor.alerts.peer_rules`; do not edit by hand.",
        "# Peer comparison for many nodes: each node's deviation from the cluster median, per compared metric",
        "# (the metrics and aggregations of dgxdoctor's peer_compare check; see docs/metrics.md).",
        "groups:",
        "  - name: dgxdoctor-peer-compare",
        "    rules:",
    ]
    for rule in RULES:
        for record, expr in _rules_for(rule):
            lines.append(f"      - record: {record}")
            lines.append(f"        expr: {json.dumps(expr)}")
    lines += ["  - name: dgxdoctor-peer-compare-groups", "    rules:"]
    for rule in RULES:
        for record, expr in _group_rules_for(rule):
            lines.append(f"      - record: {record}")
            lines.append(f"        expr: {json.dumps(expr)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())

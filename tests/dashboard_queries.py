"""The PromQL of the shipped dashboards, as Grafana would send it: every panel target, the annotation queries and
the node variable's metric, with Grafana's variables substituted. Shared by the unit and the integration tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import promql_parser

from dgxdoctor.dashboards import DASHBOARDS, dashboard_json


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str  # as written in the JSON, Grafana variables included
    instant: bool

    @property
    def where(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref}"


def dashboards() -> dict[str, dict[str, Any]]:
    return {name: json.loads(dashboard_json(name)) for name in DASHBOARDS}


def _panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def panel_queries() -> list[PanelQuery]:
    out = []
    for name, doc in dashboards().items():
        for panel in _panels(doc):
            for target in panel.get("targets", []):
                instant = target.get("instant", False)
                out.append(PanelQuery(name, panel["title"], target["refId"], target["expr"], instant))
        for ann in doc["annotations"]["list"]:
            if "expr" in ann:
                out.append(PanelQuery(name, f"annotation {ann['name']}", "-", ann["expr"], False))
    return out


def panels_with_queries() -> dict[tuple[str, str], list[PanelQuery]]:
    """(dashboard, panel title) -> its queries, for every panel that has any."""
    grouped: dict[tuple[str, str], list[PanelQuery]] = {}
    for q in panel_queries():
        grouped.setdefault((q.dashboard, q.panel), []).append(q)
    return grouped


def substitute(expr: str, rate_interval: str = "15s", node: str = ".+") -> str:
    """What Grafana sends: $node with All selected is its allValue; $__rate_interval a duration."""
    return expr.replace("$__rate_interval", rate_interval).replace("$node", node)


def metric_names(expr: str) -> set[str]:
    """The metric names a (substituted) expression selects, from a real PromQL parser's syntax tree."""
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name is None:
                raise AssertionError(f"selector without a metric name in {expr!r}")
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names

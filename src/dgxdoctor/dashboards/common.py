"""What both dashboards share: variables, annotations, the dashboard frame, and the shipped rules' record names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources

from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog import builder as cog_builder
from grafana_foundation_sdk.models import dashboard as dash

from dgxdoctor.dashboards.panels import DATASOURCE

# The Grafana release the typed builders were generated for (grafana-foundation-sdk 11.6.0); the JSON's
# schemaVersion is that release's.
GRAFANA_VERSION = "11.6"

# "All" matches every node with a value (a regex), instead of Grafana's default list of the values it knew.
ALL_NODES = ".+"

# `  - record: node:dgxdoctor_gpu_memory_used_bytes:deviation_ratio` in a shipped rule file
_RECORD_RE = re.compile(r"^\s*- record: (?P<name>\S+)\s*$", re.MULTILINE)


def recorded_names() -> list[str]:
    """Every series name the shipped recording rules record, in file order (read from the package's rule files)."""
    names: list[str] = []
    alerts = resources.files("dgxdoctor.alerts")
    for entry in sorted(alerts.iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".rules.yml", ".rules.yaml")):
            names += [m["name"] for m in _RECORD_RE.finditer(entry.read_text())]
    return names


def deviation_records() -> list[str]:
    """The per-node (and per-rail) deviation-from-median records of the peer comparison rules."""
    return [n for n in recorded_names() if n.endswith(":deviation_ratio")]


def variables() -> list[cog_builder.Builder[dash.VariableModel]]:
    datasource = dash_b.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    node = (
        dash_b.QueryVariable("node")
        .label("node")
        .description("dgxdoctor's node label (the `node` config key); All: every node that reports")
        .datasource(DATASOURCE)
        .query({"query": "label_values(dgxdoctor_build_info, node)", "refId": "node"})
        .refresh(dash.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(ALL_NODES)
        .current(dash.VariableOption(selected=True, text="All", value="$__all"))
    )
    return [datasource, node]


# An XID counter that grew within the last minute marks the time axis of every panel: a TTFT spike and the XID on
# the same node line up.
XID_ANNOTATION_EXPR = 'sum by (node, pci_bus_id, xid) (changes(dgxdoctor_xid_errors_total{node=~"$node"}[1m])) > 0'


def annotation_queries() -> list[cog_builder.Builder[dash.AnnotationQuery]]:
    builtin = (
        dash_b.AnnotationQuery()
        .name("Annotations & Alerts")
        .datasource(dash.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .type("dashboard")
        .built_in(1)
    )
    xid = (
        dash_b.AnnotationQuery()
        .name("XID errors")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(XID_ANNOTATION_EXPR)
    )
    return [builtin, xid]


def frame(title: str, uid: str, description: str, tags: Sequence[str]) -> dash_b.Dashboard:
    return (
        dash_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(tags))
        .editable()
        .tooltip(dash.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .variables(variables())
        .annotations(annotation_queries())
    )

"""Panel builders shared by the dashboards, on Grafana's typed builders (grafana-foundation-sdk, Grafana 11.6).

Build-time only: ``pip install '.[dashboards]'``. The agent never imports this module; ``dgxdoctor dashboards``
copies the JSON this code generated (``python -m dgxdoctor.dashboards.generate``).

Every panel queries the ``datasource`` variable and filters on the ``node`` variable (``node=~"$node"``, ``All``
is ``.+``). Rates use ``$__rate_interval``, which Grafana sets to at least four scrape intervals.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import statetimeline as state_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog import builder as cog_builder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common, prometheus
from grafana_foundation_sdk.models import dashboard as dash
from msgspec import Struct

DATASOURCE = dash.DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE = 'node=~"$node"'

# dgxdoctor_check_status: 0 ok, 1 warning, 2 critical, 3 unknown, -1 skipped. SKIPPED has its own colour (blue):
# "not applicable here" must never read as green.
STATUS_MAPPINGS: list[dash.ValueMapping] = [
    dash.ValueMap(
        options={
            "-1": dash.ValueMappingResult(text="SKIPPED", color="blue", index=0),
            "0": dash.ValueMappingResult(text="OK", color="green", index=1),
            "1": dash.ValueMappingResult(text="WARNING", color="yellow", index=2),
            "2": dash.ValueMappingResult(text="CRITICAL", color="red", index=3),
            "3": dash.ValueMappingResult(text="UNKNOWN", color="purple", index=4),
        }
    )
]
UP_MAPPINGS: list[dash.ValueMapping] = [
    dash.ValueMap(
        options={
            "0": dash.ValueMappingResult(text="DOWN", color="red", index=0),
            "1": dash.ValueMappingResult(text="UP", color="green", index=1),
        }
    )
]


class Q(Struct, frozen=True):
    """One PromQL query of a panel: the expression, its legend, and whether it is an instant (table) query."""

    expr: str
    legend: str = ""
    instant: bool = False


def thresholds(*steps: tuple[float | None, str]) -> dash_b.ThresholdsConfig:
    """Absolute thresholds; the first step's value is None (the base colour)."""
    return (
        dash_b.ThresholdsConfig()
        .mode(dash.ThresholdsMode.ABSOLUTE)
        .steps([dash.Threshold(value=v, color=c) for v, c in steps])
    )


GREEN_ONLY = thresholds((None, "green"))


def _targets(queries: Sequence[Q], as_table: bool = False) -> list[cog_builder.Builder[Dataquery]]:
    out: list[cog_builder.Builder[Dataquery]] = []
    for i, q in enumerate(queries):
        target = prom_b.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        if q.legend:
            target = target.legend_format(q.legend)
        target = target.instant() if q.instant or as_table else target.range()
        if as_table:
            target = target.format(prometheus.PromQueryFormat.TABLE)
        out.append(target)
    return out


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str,
    *,
    steps: dash_b.ThresholdsConfig = GREEN_ONLY,
    min_val: float | None = None,
    max_val: float | None = None,
    lines: bool = False,
    width: int = 12,
    height: int = 8,
) -> ts_b.Panel:
    """A time series panel; with ``lines`` the thresholds are drawn as dashed lines (the runbook's limits)."""
    panel = (
        ts_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .thresholds(steps)
        .span(width)
        .height(height)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
    )
    if lines:
        panel = panel.thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    return panel


def stat(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str,
    *,
    steps: dash_b.ThresholdsConfig = GREEN_ONLY,
    mappings: list[dash.ValueMapping] | None = None,
    no_value: str | None = None,
    width: int = 6,
    height: int = 5,
) -> stat_b.Panel:
    """The latest value per series, coloured by thresholds or value mappings."""
    panel = (
        stat_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .thresholds(steps)
        .span(width)
        .height(height)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        panel = panel.mappings(mappings)
    if no_value:
        panel = panel.no_value(no_value)
    return panel


def state_timeline(
    title: str,
    description: str,
    queries: Sequence[Q],
    mappings: list[dash.ValueMapping],
    *,
    width: int = 24,
    height: int = 8,
) -> state_b.Panel:
    """A row per series whose colour follows the value mappings over time (status history)."""
    return (
        state_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .mappings(mappings)
        .thresholds(GREEN_ONLY)
        .color_scheme(dash_b.FieldColor().mode(dash.FieldColorModeId.THRESHOLDS))
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .span(width)
        .height(height)
    )


def table(
    title: str,
    description: str,
    queries: Sequence[Q],
    *,
    unit: str = "none",
    steps: dash_b.ThresholdsConfig = GREEN_ONLY,
    mappings: list[dash.ValueMapping] | None = None,
    transformations: Sequence[dash.DataTransformerConfig] = (),
    colour_cells: bool = False,
    no_value: str | None = None,
    width: int = 12,
    height: int = 8,
) -> table_b.Panel:
    """Instant queries as a table (Prometheus 'table' format: one row per series, labels as columns)."""
    panel = (
        table_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries, as_table=True))
        .unit(unit)
        .thresholds(steps)
        .span(width)
        .height(height)
        .transformations(list(transformations))
    )
    if mappings:
        panel = panel.mappings(mappings)
    if colour_cells:
        panel = panel.cell_options(common.TableColoredBackgroundCellOptions())
        panel = panel.color_scheme(dash_b.FieldColor().mode(dash.FieldColorModeId.THRESHOLDS))
    if no_value:
        panel = panel.no_value(no_value)
    return panel


def transform(id_val: str, options: dict[str, object]) -> dash.DataTransformerConfig:
    return dash.DataTransformerConfig(id_val=id_val, options=options)


def row(title: str) -> dash_b.Row:
    return dash_b.Row(title)

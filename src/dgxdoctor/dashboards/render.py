"""Draw a dashboard's panels from Prometheus's answers to their queries, as a PNG (for docs/dashboards.md).

``python -m dgxdoctor.dashboards.render SNAPSHOT.json OUT.png`` with the ``plots`` extra (matplotlib). No Grafana
server runs here: the snapshot is what tests/integration/test_dashboards_prometheus.py received from a real
Prometheus for each panel, and this draws it the way the panel shows it (lines, a status matrix, a state row per
series, a value per stat), with the panel's title, unit and colours.

Snapshot: ``{"title": str, "taken_at": str, "panels": [{"title", "type", "unit", "note", "grid": {"x", "y", "w",
"h"}, "series": [{"name", "labels", "t": [unix seconds], "v": [float | null]}]}]}`` (rows included, as the
dashboard lists them).
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

STATUS_TEXT = {-1.0: "SKIPPED", 0.0: "OK", 1.0: "WARNING", 2.0: "CRITICAL", 3.0: "UNKNOWN"}
# Grafana's named colours of the status mapping (blue, green, yellow, red, purple).
STATUS_COLOUR = {-1.0: "#5794F2", 0.0: "#73BF69", 1.0: "#FADE2A", 2.0: "#F2495C", 3.0: "#B877D9"}
UP_COLOUR = {0.0: "#F2495C", 1.0: "#73BF69"}
# unit -> (scale, label)
UNITS: dict[str, tuple[float, str]] = {
    "percentunit": (100.0, "%"),
    "Bps": (1e-9, "GB/s"),
    "s": (1.0, "s"),
    "celsius": (1.0, "°C"),
    "watt": (1.0, "W"),
    "cps": (1.0, "errors/s"),
    "suffix:tok/s": (1.0, "tokens/s"),
    "reqps": (1.0, "req/s"),
}


def _latest(series: dict[str, Any]) -> float | None:
    values = [v for v in series["v"] if v is not None and not math.isnan(v)]
    return values[-1] if values else None


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=8, color="#888888", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _lines(ax: Axes, panel: dict[str, Any], t0: float) -> None:
    scale, label = UNITS.get(panel["unit"], (1.0, panel["unit"] if panel["unit"] not in ("none", "short") else ""))
    for s in panel["series"][:12]:
        t = [(x - t0) / 60 for x in s["t"]]
        v = [math.nan if y is None else y * scale for y in s["v"]]
        ax.plot(t, v, linewidth=1.2, label=s["name"][:40])
    ax.set_ylabel(label, fontsize=7)
    ax.legend(fontsize=6, loc="upper left", frameon=False)


def _state_rows(ax: Axes, panel: dict[str, Any], t0: float) -> None:
    colours = STATUS_COLOUR if "status" in panel["title"].lower() else UP_COLOUR
    series = panel["series"][:16]
    for i, s in enumerate(series):
        for x, y in zip(s["t"], s["v"], strict=True):
            if y is not None:
                ax.barh(i, 2 / 60, left=(x - t0) / 60, color=colours.get(float(y), "#CCCCCC"), height=0.8)
    ax.set_yticks(range(len(series)), [s["name"][:28] for s in series], fontsize=6)


def _matrix(ax: Axes, panel: dict[str, Any]) -> None:
    cells = {(s["labels"]["node"], s["labels"]["check"]): _latest(s) for s in panel["series"]}
    nodes = sorted({n for n, _ in cells})
    checks = sorted({c for _, c in cells})
    for i, node in enumerate(nodes):
        for j, check in enumerate(checks):
            value = cells.get((node, check))
            colour = "#EEEEEE" if value is None else STATUS_COLOUR.get(value, "#CCCCCC")
            ax.add_patch(Rectangle((j, i), 0.95, 0.9, color=colour))
            text = "not run" if value is None else STATUS_TEXT.get(value, f"{value:g}")
            ax.text(j + 0.47, i + 0.45, text, ha="center", va="center", fontsize=5.5)
    ax.set_xlim(0, len(checks))
    ax.set_ylim(len(nodes), 0)
    ax.set_xticks([j + 0.47 for j in range(len(checks))], checks, rotation=40, ha="right", fontsize=6)
    ax.set_yticks([i + 0.45 for i in range(len(nodes))], nodes, fontsize=7)


def _values(ax: Axes, panel: dict[str, Any]) -> None:
    scale, label = UNITS.get(panel["unit"], (1.0, ""))
    rows = [f"{s['name'][:46]}: {_fmt(_latest(s), scale)} {label}".rstrip() for s in panel["series"][:10]]
    ax.text(0.02, 0.95, "\n".join(rows), ha="left", va="top", fontsize=7, family="monospace", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _fmt(value: float | None, scale: float) -> str:
    return "-" if value is None else f"{value * scale:.4g}"


def _panel(ax: Axes, panel: dict[str, Any], t0: float) -> None:
    ax.set_title(panel["title"], fontsize=9, loc="left")
    ax.tick_params(labelsize=6)
    if not panel["series"]:
        note = f"no data: {panel['note']}" if panel.get("note") else "no data"
        _note(ax, "\n".join(textwrap.wrap(note, 60)))
    elif panel["type"] == "table" and "node × check" in panel["title"]:
        _matrix(ax, panel)
    elif panel["type"] == "state-timeline":
        _state_rows(ax, panel, t0)
    elif panel["type"] == "timeseries":
        _lines(ax, panel, t0)
    else:
        _values(ax, panel)


def draw(snapshot: dict[str, Any], out: Path) -> None:
    """Each panel where the dashboard puts it (gridPos: 24 columns, rows of ~30 px), with its row titles."""
    panels = snapshot["panels"]
    bottom = max(p["grid"]["y"] + p["grid"]["h"] for p in panels)
    fig = plt.figure(figsize=(20, bottom * 0.33))
    grid = fig.add_gridspec(bottom, 24, hspace=0.0, wspace=0.0)
    # The time axis: minutes before the last answer (0 is when the snapshot was taken).
    t0 = max((t for p in panels for s in p["series"] for t in s["t"]), default=0.0)
    for panel in panels:
        x, y, w, h = (panel["grid"][k] for k in ("x", "y", "w", "h"))
        if panel["type"] == "row":
            ax = fig.add_subplot(grid[y : y + h, :])
            ax.axis("off")
            ax.text(0, 0.2, panel["title"], fontsize=11, weight="bold", transform=ax.transAxes)
            continue
        # A margin inside the panel's cells for its title and tick labels.
        ax = fig.add_subplot(grid[y + 1 : y + h - 1, x : x + w])
        _panel(ax, panel, t0)
    fig.suptitle(
        f"{snapshot['title']}: Prometheus's answers at {snapshot['taken_at']} (time axes: minutes before)", fontsize=13
    )
    fig.subplots_adjust(left=0.06, right=0.99, top=1 - 1.5 / bottom, bottom=0.01)
    fig.savefig(out, dpi=60)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m dgxdoctor.dashboards.render SNAPSHOT.json OUT.png\n")
        return 64
    draw(json.loads(Path(argv[0]).read_text()), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Grafana dashboards for dgxdoctor, shipped as package data, and the provisioning file that loads them.

The JSON is generated from code (``python -m dgxdoctor.dashboards.generate``, with the ``dashboards`` extra
installed); this module only copies it, with the standard library, so the agent never imports Grafana's builders.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# File name -> what it shows; generate.py writes exactly these.
DASHBOARDS: dict[str, str] = {
    "dgxdoctor-overview.json": "Cluster overview: every check, GPUs, XIDs, IB rails, NCCL, drift, remediation",
    "dgxdoctor-serving.json": "Serving: vLLM's queue, KV cache, latencies and throughput next to the hardware",
}
PROVISIONING_FILE = "dgxdoctor-dashboards.yaml"
FOLDER = "dgxdoctor"


def dashboard_json(name: str) -> str:
    """The shipped JSON of one dashboard (a name of ``DASHBOARDS``)."""
    if name not in DASHBOARDS:
        raise KeyError(f"no dashboard {name!r}; shipped: {', '.join(DASHBOARDS)}")
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def provisioning_yaml(dashboards_dir: Path) -> str:
    """A Grafana dashboard provider (provisioning/dashboards/*.yaml) loading the dashboards from ``dashboards_dir``."""
    path = str(dashboards_dir.resolve())
    if any(c in path for c in '\n\r"\\'):
        raise ValueError(f"dashboard directory {path!r}: quotes, backslashes and newlines are not supported")
    return (
        "# Grafana dashboard provisioning, written by `dgxdoctor dashboards`. Copy this file into Grafana's\n"
        "# provisioning/dashboards/ folder (e.g. /etc/grafana/provisioning/dashboards/) and restart Grafana.\n"
        "apiVersion: 1\n"
        "providers:\n"
        f"  - name: {FOLDER}\n"
        f"    folder: {FOLDER}\n"
        "    type: file\n"
        "    disableDeletion: false\n"
        "    allowUiUpdates: false\n"
        "    updateIntervalSeconds: 60\n"
        "    options:\n"
        f'      path: "{path}"\n'
        "      foldersFromFilesStructure: false\n"
    )


def write_dashboards(dest: Path) -> list[Path]:
    """Write every dashboard and the provisioning file into ``dest`` (created if missing); return the paths."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in DASHBOARDS:
        path = dest / name
        path.write_text(dashboard_json(name), encoding="utf-8")
        written.append(path)
    provisioning = dest / PROVISIONING_FILE
    provisioning.write_text(provisioning_yaml(dest), encoding="utf-8")
    written.append(provisioning)
    return written

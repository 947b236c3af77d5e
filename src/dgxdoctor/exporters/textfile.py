"""The exposition as a file for node_exporter's textfile collector, for sites that scrape node_exporter.

node_exporter reads every ``*.prom`` in its ``--collector.textfile.directory`` at each scrape, so the file is
written to a temporary name in the same directory and renamed over the old one: a scrape sees the old file
or the new one, never half of one (the textfile collector's documented advice).
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from dgxdoctor.sources.statefile import atomic_write


def write_textfile(path: Path, registry: CollectorRegistry) -> None:
    # 0644: node_exporter runs as its own user; the daemon's umask would leave the file unreadable to it.
    # (prometheus_client's write_to_textfile renames atomically too, but neither fsyncs nor sets the mode.)
    atomic_write(path, generate_latest(registry), 0o644)

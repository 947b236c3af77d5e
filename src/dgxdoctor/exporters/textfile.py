"""The exposition as a file for node_exporter's textfile collector, for sites that scrape node_exporter.

node_exporter reads every ``*.prom`` in its ``--collector.textfile.directory`` at each scrape, so the file is
written to a temporary name in the same directory and renamed over the old one: a scrape sees the old file
or the new one, never half of one (the textfile collector's documented advice).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest


def write_textfile(path: Path, registry: CollectorRegistry) -> None:
    data = generate_latest(registry)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

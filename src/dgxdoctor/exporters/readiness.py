"""The readiness signal's metrics (daemon/readiness.py): the state in force, its changes, the time to recover."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from dgxdoctor.exporters.snapshot import SnapshotCollector, family, one_hot, single
from dgxdoctor.judge.readiness import STATES
from dgxdoctor.result import MetricSpec

READY = MetricSpec("dgxdoctor_ready", "1 while GET /ready answers 200 (the node is in rotation), else 0")
STATE = MetricSpec(
    "dgxdoctor_readiness_state",
    "1 for the readiness state in force (ready, suspect, draining, restarting, down), 0 for the others",
    labels=("state",),
)
CHANGES = MetricSpec(
    "dgxdoctor_readiness_changes_total",
    "times the readiness state became each state since dgxdoctor started (every state at 0 from the start)",
    "counter",
    ("state",),
)
RECOVERIES = MetricSpec(
    "dgxdoctor_serving_recoveries_total",
    "incidents ended: the node left rotation and became ready again (a good completion verified it)",
    "counter",
)
RECOVER_SECONDS = MetricSpec(
    "dgxdoctor_serving_recover_seconds_total",
    "seconds from leaving rotation (the fault seen, or a drain begun) to ready again, summed over incidents: "
    "with dgxdoctor_serving_recoveries_total, the mean time to recover",
    "counter",
)
LAST_RECOVER = MetricSpec(
    "dgxdoctor_serving_last_recover_seconds",
    "the last incident's seconds from leaving rotation to ready again (NaN before the first)",
)
READINESS_METRICS = (READY, STATE, CHANGES, RECOVERIES, RECOVER_SECONDS, LAST_RECOVER)


class ReadinessCollector(SnapshotCollector):
    def families(self, node: str, snap: dict[str, Any]) -> Iterator[Metric]:
        yield single(READY, node, 1.0 if snap["state"] == "ready" else 0.0)
        yield one_hot(STATE, node, STATES, snap["state"])
        yield family(CHANGES, node, (((name,), snap["changes"].get(name, 0)) for name in STATES))
        yield single(RECOVERIES, node, snap["recoveries"])
        yield single(RECOVER_SECONDS, node, snap["recover_s_total"])
        yield single(LAST_RECOVER, node, snap["last_recover_s"])

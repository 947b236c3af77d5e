"""The readiness signal's metrics (daemon/readiness.py): the state in force, its changes, the time to recover."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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


class ReadinessCollector(Collector):
    def __init__(self, node: Callable[[], str], snapshot: Callable[[], dict[str, Any]]) -> None:
        self.node = node
        self.snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        node = self.node()
        snap = self.snapshot()
        ready = GaugeMetricFamily(READY.name, READY.help, labels=["node"])
        ready.add_metric([node], 1.0 if snap["state"] == "ready" else 0.0)
        yield ready
        state = GaugeMetricFamily(STATE.name, STATE.help, labels=["node", "state"])
        changes = CounterMetricFamily(CHANGES.name, CHANGES.help, labels=["node", "state"])
        for name in STATES:
            state.add_metric([node, name], 1.0 if snap["state"] == name else 0.0)
            changes.add_metric([node, name], float(snap["changes"].get(name, 0)))
        yield state
        yield changes
        for spec, value in ((RECOVERIES, snap["recoveries"]), (RECOVER_SECONDS, snap["recover_s_total"])):
            family = CounterMetricFamily(spec.name, spec.help, labels=["node"])
            family.add_metric([node], float(value))
            yield family
        last = GaugeMetricFamily(LAST_RECOVER.name, LAST_RECOVER.help, labels=["node"])
        last.add_metric([node], math.nan if snap["last_recover_s"] is None else float(snap["last_recover_s"]))
        yield last

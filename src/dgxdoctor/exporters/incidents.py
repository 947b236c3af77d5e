"""Incident figures (``fleet.incidents``): recovery time as a histogram, the open incident, the last one's time.

MTTR over a day: ``increase(dgxdoctor_incident_recovery_seconds_sum[1d]) /
increase(dgxdoctor_incident_recovery_seconds_count[1d])``; time between incidents: ``time() -
dgxdoctor_incident_last_detected_timestamp_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from dgxdoctor.fleet.incidents import BUCKETS, IncidentTracker
from dgxdoctor.result import MetricSpec

RECOVERY = MetricSpec(
    "dgxdoctor_incident_recovery_seconds",
    "seconds from an incident's first detection (the first CRITICAL result) to the first good completion after it "
    "(the vllm check's canary; on a node serving none, no check CRITICAL any more), one observation per incident",
    "histogram",
)
OPEN = MetricSpec("dgxdoctor_incident_open", "1 while an incident is open on this node (detected, not recovered)")
LAST_DETECTED = MetricSpec(
    "dgxdoctor_incident_last_detected_timestamp_seconds",
    "Unix time the last incident was detected (absent before the first); time() minus it: time since the last",
)
SINCE_LAST = MetricSpec(
    "dgxdoctor_incident_since_last_seconds",
    "seconds since the last incident was detected, at scrape time (absent before the first)",
)
INCIDENT_METRICS = (RECOVERY, OPEN, LAST_DETECTED, SINCE_LAST)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus' client libraries write it: 60.0, not 60."""
    return repr(float(bound))


class IncidentCollector(Collector):
    def __init__(self, node: Callable[[], str], tracker: IncidentTracker, clock: Callable[[], float] = time.time):
        self.node = node
        self.tracker = tracker
        self.clock = clock

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        node = self.node()
        counts, total, count = self.tracker.histogram()
        hist = HistogramMetricFamily(RECOVERY.name, RECOVERY.help, labels=["node"])
        buckets = [(_le(b), float(c)) for b, c in zip(BUCKETS, counts, strict=True)] + [("+Inf", float(count))]
        hist.add_metric([node], buckets, total)
        yield hist
        summary = self.tracker.summary()
        opened = GaugeMetricFamily(OPEN.name, OPEN.help, labels=["node"])
        opened.add_metric([node], 1.0 if summary["open"] else 0.0)
        yield opened
        last = summary["last"]
        if last is not None:
            detected = GaugeMetricFamily(LAST_DETECTED.name, LAST_DETECTED.help, labels=["node"])
            detected.add_metric([node], float(last["detected_at"]))
            yield detected
            since = GaugeMetricFamily(SINCE_LAST.name, SINCE_LAST.help, labels=["node"])
            since.add_metric([node], max(self.clock() - float(last["detected_at"]), 0.0))
            yield since

"""The collectors over a daemon part's metrics snapshot (remediation's, the readiness signal's): at each scrape the
part hands over a dict of its figures and the collector builds fresh families from it, every series labelled with
the node. Each family's name, help, type and label names are its ``MetricSpec``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dgxdoctor.result import MetricSpec

Series = Iterable[tuple[Sequence[str], float]]  # each series' values of the spec's labels, and its value


class SnapshotCollector(Collector):
    """``node()`` and ``snapshot()`` are asked at each scrape; a subclass turns them into families (``families``)."""

    def __init__(self, node: Callable[[], str], snapshot: Callable[[], dict[str, Any]]) -> None:
        self.node = node
        self.snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.families(self.node(), self.snapshot())

    def families(self, node: str, snap: dict[str, Any]) -> Iterator[Metric]:
        raise NotImplementedError


def family(spec: MetricSpec, node: str, series: Series) -> Metric:
    """``spec``'s family (a counter or a gauge, as it says) with ``series``, each labelled ``node`` first."""
    kind = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
    out = kind(spec.name, spec.help, labels=["node", *spec.labels])
    for labels, value in series:
        out.add_metric([node, *labels], float(value))
    return out


def single(spec: MetricSpec, node: str, value: float | None) -> Metric:
    """``spec``'s one series; ``None`` (nothing measured yet) is NaN."""
    return family(spec, node, [((), math.nan if value is None else value)])


def one_hot(spec: MetricSpec, node: str, names: Iterable[str], current: str) -> Metric:
    """1 for the ``current`` one of ``names`` (spec's one label), 0 for the others."""
    return family(spec, node, (((name,), 1.0 if name == current else 0.0) for name in names))

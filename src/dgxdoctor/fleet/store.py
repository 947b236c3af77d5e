"""The result store: the latest result of every check, runs per check, and status transitions.

The exporter, ``/state`` and the peer comparison all read it; only the scheduler writes it, on the event loop.
A lock guards it because the peer comparison reads it from its check thread; readers get immutable results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from msgspec import Struct

from dgxdoctor.result import DEFAULT_GROUP, CheckResult, Sample, Status, merged_facts

# Fact keys that differ between nodes by design; peers never compare them and /state still shows them.
# container.name: vLLM's container is named per node (vllm-head, vllm-worker); its image (container.image) is compared.
NODE_LOCAL_FACTS = frozenset({"host_ip", "hostname", "node", "boot_id", "machine_id", "ip_address", "container.name"})


class Transition(Struct, frozen=True):
    check: str
    old: Status | None
    new: Status
    result: CheckResult


class ResultStore:
    def __init__(self, node: str, clock: Callable[[], float] | None = None, group: str = DEFAULT_GROUP) -> None:
        self.node = node
        self.group = group  # the node's serving group ([node] group), on /state and dgxdoctor_node_info
        self._latest: dict[str, CheckResult] = {}
        self._clock = clock or time.time
        self._runs: dict[str, int] = {}
        self._probe_timeouts: dict[tuple[str, str], int] = {}
        # Per check, its declared counter series (``Check.zero_samples``) at their last exported value.
        self._held: dict[str, dict[tuple[str, tuple[str, ...]], Sample]] = {}
        # Written on the event loop; read also from check threads (peer_compare's local snapshot).
        self._lock = threading.Lock()
        # Told of every result put (the incident tracker), after the store holds it.
        self.listeners: list[Callable[[CheckResult], None]] = []

    def put(self, result: CheckResult) -> Transition | None:
        """Record a result; return the transition when the check's status changed (or it ran first)."""
        with self._lock:
            previous = self._latest.get(result.check)
            self._latest[result.check] = result
            self._runs[result.check] = self._runs.get(result.check, 0) + 1
            for probe in result.timeouts:
                key = (result.check, probe)
                self._probe_timeouts[key] = self._probe_timeouts.get(key, 0) + 1
            held = self._held.get(result.check)
            if held:
                for sample in result.samples:
                    if (series := _series(sample)) in held:
                        held[series] = sample
        for listener in self.listeners:
            listener(result)
        if previous is None or previous.status is not result.status:
            return Transition(result.check, previous.status if previous else None, result.status, result)
        return None

    def declare(self, check: str, probes: tuple[str, ...], zeros: Iterable[Sample] = ()) -> None:
        """A scheduled check: its run and probe-timeout counters, and its own counters ``zeros``
        (``Check.zero_samples``), exist at 0 before its first run, so that Prometheus's ``increase()`` sees the
        first one. A declared series then holds its last value while a result lacks it (a run that failed or
        timed out exports no samples): a counter that fell back to 0 would read as a reset, its next value as an
        increase. Declaring again (a reload replaced the check, whose counts start over) starts them at 0 again:
        held at the old count, the new instance's first count could equal it and show no increase."""
        with self._lock:
            self._runs.setdefault(check, 0)
            for probe in probes:
                self._probe_timeouts.setdefault((check, probe), 0)
            self._held[check] = {_series(sample): sample for sample in zeros}

    def forget(self, check: str) -> None:
        """A check that was disabled on reload leaves the store (and the exposition) with it."""
        with self._lock:
            self._latest.pop(check, None)
            self._runs.pop(check, None)
            self._held.pop(check, None)
            for key in [k for k in self._probe_timeouts if k[0] == check]:
                del self._probe_timeouts[key]

    def probe_timeouts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._probe_timeouts)

    def held_samples(self) -> dict[str, tuple[Sample, ...]]:
        """Per check, its declared counter series at their last value (0 before the first count)."""
        with self._lock:
            return {check: tuple(held.values()) for check, held in self._held.items() if held}

    def latest(self) -> dict[str, CheckResult]:
        with self._lock:
            return dict(self._latest)

    def get(self, check: str) -> CheckResult | None:
        with self._lock:
            return self._latest.get(check)

    def runs_total(self) -> dict[str, int]:
        with self._lock:
            return dict(self._runs)

    def facts(self) -> dict[str, str]:
        return merged_facts(self.latest().values())

    def snapshot(self, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
        """The ``/state`` document. ``exclude`` leaves checks out (the peer comparison leaves itself out)."""
        results = [r for name, r in self.latest().items() if name not in exclude]
        from dgxdoctor.documents import ResultsDocument  # models built at the first /state, not at import

        return ResultsDocument.of(self.node, results, self._clock(), self.group).state()


def _series(sample: Sample) -> tuple[str, tuple[str, ...]]:
    return sample.metric.name, tuple(sample.labels[label] for label in sample.metric.labels)

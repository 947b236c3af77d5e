"""The result store: the latest result of every check, a short history, and status transitions.

The exporter, ``/state`` and the peer comparison all read it; only the scheduler writes it. Everything runs
on the event loop thread, so there are no locks; readers get immutable results.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dgxdoctor.report import overall_status
from dgxdoctor.result import CheckResult, Status

# Fact keys that differ between nodes by design; peers never compare them and /state still shows them.
NODE_LOCAL_FACTS = frozenset({"host_ip", "hostname", "node", "boot_id", "machine_id", "ip_address"})


@dataclass(frozen=True)
class Transition:
    check: str
    old: Status | None
    new: Status
    result: CheckResult


class ResultStore:
    def __init__(self, node: str, history: int = 20, clock: Callable[[], float] | None = None) -> None:
        self.node = node
        self._history_size = history
        self._latest: dict[str, CheckResult] = {}
        self._history: dict[str, deque[CheckResult]] = {}
        self._clock = clock or time.time
        self._runs: dict[str, int] = {}
        self._probe_timeouts: dict[tuple[str, str], int] = {}
        # Written on the event loop; read also from check threads (peer_compare's local snapshot).
        self._lock = threading.Lock()

    def put(self, result: CheckResult) -> Transition | None:
        """Record a result; return the transition when the check's status changed (or it ran first)."""
        with self._lock:
            previous = self._latest.get(result.check)
            self._latest[result.check] = result
            self._history.setdefault(result.check, deque(maxlen=self._history_size)).append(result)
            self._runs[result.check] = self._runs.get(result.check, 0) + 1
            for probe in result.timeouts:
                key = (result.check, probe)
                self._probe_timeouts[key] = self._probe_timeouts.get(key, 0) + 1
        if previous is None or previous.status is not result.status:
            return Transition(result.check, previous.status if previous else None, result.status, result)
        return None

    def declare(self, check: str, probes: tuple[str, ...]) -> None:
        """A scheduled check: its run and probe-timeout counters exist (at 0) before its first run, so that
        Prometheus's ``increase()`` sees the first one."""
        with self._lock:
            self._runs.setdefault(check, 0)
            for probe in probes:
                self._probe_timeouts.setdefault((check, probe), 0)

    def forget(self, check: str) -> None:
        """A check that was disabled on reload leaves the store (and the exposition) with it."""
        with self._lock:
            self._latest.pop(check, None)
            self._history.pop(check, None)
            self._runs.pop(check, None)
            for key in [k for k in self._probe_timeouts if k[0] == check]:
                del self._probe_timeouts[key]

    def probe_timeouts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._probe_timeouts)

    def latest(self) -> dict[str, CheckResult]:
        with self._lock:
            return dict(self._latest)

    def get(self, check: str) -> CheckResult | None:
        with self._lock:
            return self._latest.get(check)

    def history(self, check: str) -> list[CheckResult]:
        with self._lock:
            return list(self._history.get(check, ()))

    def runs_total(self) -> dict[str, int]:
        with self._lock:
            return dict(self._runs)

    def facts(self) -> dict[str, str]:
        return dict(_merged_facts(list(self.latest().values())))

    def snapshot(self, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
        """The ``/state`` document. ``exclude`` leaves checks out (the peer comparison leaves itself out)."""
        results = [r for name, r in self.latest().items() if name not in exclude]
        return state_document(self.node, results, self._clock())


def state_document(node: str, results: list[CheckResult], generated_at: float) -> dict[str, Any]:
    return {
        "node": node,
        "status": overall_status(results).value,
        "generated_at": round(generated_at, 3),
        "checks": [result_to_state(r) for r in results],
        "facts": _merged_facts(results),
    }


def result_to_state(result: CheckResult) -> dict[str, Any]:
    doc = result.to_dict()
    doc["started_at"] = round(result.started_at, 3)
    # JSON has no NaN or infinity: a non-finite value travels as null, which peers treat as absent.
    doc["samples"] = [
        {"name": s.metric.name, "labels": dict(s.labels), "value": s.value if math.isfinite(s.value) else None}
        for s in result.samples
    ]
    doc["facts"] = dict(result.facts)
    return doc


def _merged_facts(results: list[CheckResult]) -> Mapping[str, str]:
    facts: dict[str, str] = {}
    for result in results:
        facts.update(result.facts)
    return facts

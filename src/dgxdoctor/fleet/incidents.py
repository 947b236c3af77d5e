"""Incidents: a problem from its first detection to the first good completion after it, for serving MTTR and the
time between incidents.

An incident opens at the first CRITICAL result of any check while none is open (``peer_compare`` excepted: the
other node's incident is that node's). It closes at the first good completion after it: a run of the vllm check
that is no longer CRITICAL and whose canary completed (``dgxdoctor_vllm_canary_latency_seconds`` present). A node
that serves no completion (a Ray worker: its vllm check is SKIPPED) closes it when no check is CRITICAL any more.
The action taken meanwhile is read from remediation's audit. Each opening and closing is one line appended to
``<state_dir>/incidents.jsonl`` (fsynced), read back at start, so the figures survive a restart of the agent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor.records import asdict
from dgxdoctor.result import CheckResult, Status

INCIDENTS_FILE = "incidents.jsonl"
# Each line's format: 1 is 0.1.0's line with its version; that release wrote none (read the same: its keys).
LINE_VERSION = 1
CANARY_METRIC = "dgxdoctor_vllm_canary_latency_seconds"
NOT_LOCAL = frozenset({"peer_compare"})
# Recovery time buckets, seconds: a vLLM restart takes minutes on a 70B model, a cluster restart ten or more.
BUCKETS = (15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0)

# (from, to) wall-clock times -> the remediation actions audited between them ("restart_vllm success").
ActionsBetween = Callable[[float, float], list[str]]


class Incident(Struct, frozen=True):
    detected_at: float
    problem: str  # "<check>: <first critical finding code>"
    recovered_at: float | None = None
    action: str | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.detected_at


def _problem(result: CheckResult) -> str:
    code = next((f.code for f in result.findings if f.status is Status.CRITICAL), None)
    return f"{result.check}: {code or result.summary[:80]}"


def good_completion(result: CheckResult) -> bool:
    return (
        result.check == "vllm"
        and result.status is not Status.CRITICAL
        and any(s.metric.name == CANARY_METRIC and s.value is not None for s in result.samples)
    )


class IncidentTracker:
    """Fed every result the daemon stores (``observe``); read by the exporter and the status page."""

    def __init__(self, state_dir: Path | None, actions_between: ActionsBetween | None = None) -> None:
        self.path = state_dir / INCIDENTS_FILE if state_dir is not None else None
        self.actions_between = actions_between
        self.open: Incident | None = None
        self.closed: list[Incident] = []
        self.last: Incident | None = None
        self.critical: set[str] = set()
        self.serves = False  # a vllm check here has completed a canary at least once
        self.error: str | None = None  # the last failure to read or write the incidents file
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            return
        for line in lines:
            try:
                doc = json.loads(line)
                incident = Incident(float(doc["detected_at"]), str(doc["problem"]),
                                    doc.get("recovered_at"), doc.get("action"))  # fmt: skip
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a line torn by a crash
            self.last = incident
            if incident.recovered_at is None:
                self.open = incident
            else:
                self.open = None
                self.closed.append(incident)

    def _append(self, incident: Incident) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                line = {**asdict(incident), "version": LINE_VERSION}
                os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:  # the figures stay in memory; a full disk must not stop the store
            self.error = f"{self.path}: {exc.strerror or exc}"

    def observe(self, result: CheckResult) -> None:
        if result.check in NOT_LOCAL:
            return
        at = result.started_at + result.duration_s if result.started_at else time.time()
        with self._lock:
            if result.status is Status.CRITICAL:
                self.critical.add(result.check)
            else:
                self.critical.discard(result.check)
            self.serves = self.serves or good_completion(result)
            if self.open is None and result.status is Status.CRITICAL:
                self.open = self.last = Incident(at, _problem(result))
                self._append(self.open)
            elif self.open is not None and self._recovered(result):
                self._close(at)

    def _recovered(self, result: CheckResult) -> bool:
        if self.serves:
            return good_completion(result) and result.started_at >= self.open.detected_at if self.open else False
        return not self.critical

    def _close(self, at: float) -> None:
        assert self.open is not None
        actions = self.actions_between(self.open.detected_at, at) if self.actions_between else []
        done = replace(self.open, recovered_at=at, action=", ".join(actions) or None)
        self.open = None
        self.last = done
        self.closed.append(done)
        self._append(done)

    def histogram(self) -> tuple[list[int], float, int]:
        """Cumulative counts per bucket of ``BUCKETS`` (then +Inf), the sum and the count of recovery times."""
        with self._lock:
            times = [i.recovery_s for i in self.closed if i.recovery_s is not None]
        return [sum(1 for t in times if t <= b) for b in BUCKETS], float(sum(times)), len(times)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            last = self.last
            doc = None if last is None else {**asdict(last), "recovery_s": last.recovery_s}
            return {"open": self.open is not None, "last": doc, "count": len(self.closed) + (1 if self.open else 0)}

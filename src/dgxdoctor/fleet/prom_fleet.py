"""The fleet as Prometheus sees it, for remediation (``[fleet] prometheus_url``): the fleet breaker's members and
the critical findings of the other nodes of this node's serving group, from one query.

With Prometheus as the cluster view no agent fetches a peer's ``/state``, so remediation reads the fleet here:

- **The breaker's members** (``fleet.breaker.Member``): every node Prometheus scrapes with its group
  (``dgxdoctor_node_info``), unhealthy when one of its checks is CRITICAL (``dgxdoctor_check_status == 2``) or its
  target is down (``up == 0`` of the job: the node it last exported on that instance within an hour, or the bare
  instance where it never did). An agent that cannot answer is no healthy node, as in the mesh.
- **The group's critical findings** (``dgxdoctor_finding_info{status="critical"}``: check, code, subject), as the
  ``/state``-shaped document ``judge.hardware_cause.peer_causes`` reads: judge/ decides what follows from each code.

``PromFleet`` holds the last answer: the daemon refreshes it in the background (a scheduler job, one query under
``[fleet] prometheus_timeout_s``), so remediation's evaluation reads memory and never waits on Prometheus. When
Prometheus gives no answer the fleet is unknown, and each reader takes its cautious side (``reading``,
``group_peers``), and says so.

By hand: ``curl -G PROMETHEUS/api/v1/query --data-urlencode "query=$(python -c 'from dgxdoctor.fleet.prom_fleet
import query; print(query("dgxdoctor"))')"``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from msgspec import Struct

from dgxdoctor.fleet.breaker import FleetReading, Member
from dgxdoctor.fleet.prom_view import (
    CHECK_STATUS,
    FINDING_INFO,
    GONE_WINDOW,
    NODE_INFO,
    PrometheusUnavailable,
    instant_query,
)
from dgxdoctor.result import Status

# The names the query gives its derived series (label_replace), so one answer says what each series is.
CRITICAL = "dgxdoctor_fleet_critical"  # a node with a CRITICAL check: {node}
DOWN = "dgxdoctor_fleet_down"  # a target down, named by the node it last exported: {node, group, instance}
DOWN_TARGET = "dgxdoctor_fleet_down_target"  # a target down that never exported node_info: {instance}
# Prometheus silent: its last answer is still counted this long (a blip must not close a tripped breaker and let
# every node restart at once); past it, only what this node knows of itself.
KEEP_S = 300.0


def query(job: str) -> str:
    """The one PromQL expression (``job``: the scrape job of the agents)."""
    sel = f'job="{job}"'
    known = f"last_over_time({NODE_INFO}{{{sel}}}[{GONE_WINDOW}])"
    down = f"(up{{{sel}}} == 0)"
    critical = f"count by (node) ({CHECK_STATUS}{{{sel}}} == {Status.CRITICAL.code})"
    return " or ".join(
        (
            f"{NODE_INFO}{{{sel}}}",
            f'{FINDING_INFO}{{{sel},status="{Status.CRITICAL.value}"}}',
            f'label_replace({critical}, "__name__", "{CRITICAL}", "", "")',
            f'label_replace({known} and on(instance) {down}, "__name__", "{DOWN}", "", "")',
            f'label_replace({down} unless on(instance) {known}, "__name__", "{DOWN_TARGET}", "", "")',
        )
    )


class FleetNode(Struct, frozen=True):
    """One node: its group (None: none known), whether its target is up, whether a check of it is CRITICAL, and its
    critical findings (labels check, code, subject)."""

    node: str
    group: str | None
    up: bool
    critical: bool
    findings: tuple[tuple[str, str, str], ...] = ()

    @property
    def member(self) -> Member:
        return Member(self.node, self.group, self.up and not self.critical)

    def doc(self) -> dict[str, Any]:
        """Its critical findings as a ``/state`` document (no message: Prometheus has none; no cure: judge/ decides
        it by code)."""
        findings = [
            {"code": code, "status": Status.CRITICAL.value, "subject": subject or None, "message": ""}
            for _, code, subject in self.findings
        ]
        return {"node": self.node, "group": self.group, "checks": [{"name": "prometheus", "findings": findings}]}


class FleetAnswer(Struct, frozen=True):
    nodes: tuple[FleetNode, ...]


def parse_fleet(result: Sequence[Any]) -> FleetAnswer:
    """The fleet from the query's series (Prometheus's ``data.result``); series of other shapes are ignored."""
    info: dict[str, str | None] = {}
    down: dict[str, str | None] = {}
    critical: set[str] = set()
    findings: dict[str, list[tuple[str, str, str]]] = {}
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(labels, dict):
            continue
        name, node = labels.get("__name__"), str(labels.get("node") or "")
        if name == DOWN_TARGET and labels.get("instance"):
            down.setdefault(str(labels["instance"]), None)
        elif not node:
            continue
        elif name == NODE_INFO:
            info[node] = str(labels["group"]) if labels.get("group") else None
        elif name == DOWN:
            down[node] = str(labels["group"]) if labels.get("group") else None
        elif name == CRITICAL:
            critical.add(node)
        elif name == FINDING_INFO:
            triple = (str(labels.get("check", "")), str(labels.get("code", "")), str(labels.get("subject", "")))
            findings.setdefault(node, []).append(triple)
    nodes = [FleetNode(n, g, True, n in critical, tuple(sorted(findings.get(n, ())))) for n, g in info.items()]
    nodes += [FleetNode(n, g, False, False) for n, g in down.items() if n not in info]
    return FleetAnswer(tuple(sorted(nodes, key=lambda n: n.node)))


async def fetch_fleet(client: httpx.AsyncClient, url: str, job: str, timeout_s: float) -> FleetAnswer:
    """One request to ``url``'s query API, held to ``timeout_s`` connect to last byte; PrometheusUnavailable when
    it gives no usable answer."""
    result = await instant_query(client, url, query(job), timeout_s)
    return parse_fleet(result)


class PromFleet:
    """The last answer, kept: written by the refresh job's thread, read by remediation on the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._answer: FleetAnswer | None = None
        self._answered_at: float | None = None
        self._error: str | None = "not asked yet"
        # This node's group peers: each one's last document while it was scraped (its critical findings, maybe
        # none), and the node and group it was kept for.
        self._peer_docs: dict[str, dict[str, Any]] = {}
        self._kept_for: tuple[str, str] = ("", "")

    def refresh(
        self, client: Callable[[], httpx.AsyncClient], url: str, job: str, timeout_s: float, node: str, group: str
    ) -> None:
        """Ask Prometheus once, on an event loop of the calling thread (the scheduler's job thread)."""

        async def ask() -> FleetAnswer:
            async with client() as c:
                return await fetch_fleet(c, url, job, timeout_s)

        loop = asyncio.new_event_loop()
        try:
            self.record(loop.run_until_complete(ask()), node, group)
        except PrometheusUnavailable as exc:
            self.failed(str(exc))
        finally:
            loop.close()

    def record(self, answer: FleetAnswer, node: str, group: str) -> None:
        """A usable answer. The documents of this node's group peers that are scraped replace what was kept; a peer
        whose target is down keeps its last one (its causes are unknown, not gone); a node no longer listed leaves."""
        with self._lock:
            if self._kept_for != (node, group):
                self._peer_docs, self._kept_for = {}, (node, group)
            listed = {n.node for n in answer.nodes}
            docs = {n: d for n, d in self._peer_docs.items() if n in listed}
            for n in answer.nodes:
                if n.node != node and n.group == group and n.up:
                    docs[n.node] = n.doc()
            self._peer_docs = docs
            self._answer, self._answered_at, self._error = answer, self.clock(), None

    def failed(self, error: str) -> None:
        with self._lock:
            self._error = error

    def reading(self, own: Member) -> FleetReading:
        """The breaker's members: this node as it knows itself, the others as Prometheus last said. Prometheus
        silent: its last answer for ``KEEP_S``, then this node alone; either way ``unknown`` says so, for the audit
        (never a silent "all healthy")."""
        with self._lock:
            answer, at, error = self._answer, self._answered_at, self._error
        age = None if at is None else self.clock() - at
        if answer is None or age is None or age > KEEP_S:
            since = "" if age is None else f" for {age:.0f} s"
            return FleetReading((own,), f"fleet unknown: no answer from Prometheus{since} ({error}); "
                                       "only this node counted")  # fmt: skip
        members = (own, *(n.member for n in answer.nodes if n.node != own.node))
        if error is None:
            return FleetReading(members)
        return FleetReading(members, f"Prometheus gave no answer now ({error}): its answer of {age:.0f} s ago counted")

    def group_peers(self) -> list[tuple[str, dict[str, Any], str | None]]:
        """(peer, its last document, why it was kept or None) for each other node of this node's group: a peer not
        scraped now, or Prometheus silent, keeps its last document (the mesh keeps a silent peer's last cause)."""
        with self._lock:
            answer, error, docs = self._answer, self._error, dict(self._peer_docs)
        up = {n.node for n in answer.nodes if n.up} if answer is not None else set()
        out: list[tuple[str, dict[str, Any], str | None]] = []
        for peer, doc in sorted(docs.items()):
            if error is not None:
                kept = f"Prometheus gave no answer now ({error[:100]}): {peer}'s last cause, kept"
            elif peer not in up:
                kept = f"{peer} is not scraped by Prometheus now (its target is down): its last cause, kept"
            else:
                kept = None
            out.append((peer, doc, kept))
        return out

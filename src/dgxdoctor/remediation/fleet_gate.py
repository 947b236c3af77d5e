"""No restart while the fleet breaker is tripped: more than ``fleet_breaker_fraction`` of the fleet's nodes or
serving groups unhealthy at once (``fleet.breaker``). Restarts cannot cure what many nodes share (a fabric, a
driver rollout) and would multiply the outage; every restart decision is refused, audited with the fleet's
figures, and one page per problem says so while the breaker stays tripped. It closes by itself when the fleet is
healthy again: it opens on the fleet's state, not on what this node did (that is the guard's budget breaker).

A view that could not read all of the fleet (Prometheus silent: ``fleet.prom_fleet``) counts only what it knows;
a restart it then lets run says so in its audited reason, never a silent "all healthy".
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec.structs import replace

from dgxdoctor.fleet.breaker import FleetHealth
from dgxdoctor.remediation.guard import Decision
from dgxdoctor.remediation.policy import RESTARTS


class FleetGate:
    """Remembers which problems were paged during the present trip, so one page goes out per problem."""

    def __init__(self) -> None:
        self.paged: set[str] = set()
        self.health: FleetHealth | None = None  # the last verdict (metrics)
        self.refused = 0  # restarts refused since start

    @property
    def open(self) -> bool:
        return self.health is not None and self.health.tripped

    def apply(self, decisions: Sequence[Decision], health: FleetHealth | None) -> tuple[list[Decision], list[Decision]]:
        """(decisions with every restart that would run now refused, the pages to send); unchanged when the
        breaker is not tripped (or there is no fleet view)."""
        self.health = health
        if health is None or not health.tripped:
            self.paged.clear()
            if health is not None and health.unknown:  # not tripped on what it could read: the audit says the rest
                return [_noted(d, health.unknown) for d in decisions], []
            return list(decisions), []
        out: list[Decision] = []
        pages: list[Decision] = []
        for d in decisions:
            if d.verdict != "act" or d.action not in RESTARTS:
                out.append(d)
                continue
            self.refused += 1
            reason = f"fleet breaker: {health.reason}: a restart cannot cure what the fleet shares; paged instead"
            out.append(replace(d, verdict="refuse", reason=reason))
            if d.problem.key not in self.paged:
                self.paged.add(d.problem.key)
                message = f"{d.action} for {d.problem.reason} not run: {health.reason}"
                pages.append(Decision("page", "page", message, replace(d.problem, action="page")))
        return out, pages


def _noted(d: Decision, unknown: str) -> Decision:
    """A restart that would run, its reason saying what of the fleet the breaker could not count."""
    if d.verdict != "act" or d.action not in RESTARTS:
        return d
    return replace(d, reason=f"{d.reason}; fleet breaker not tripped on what it could read: {unknown}")

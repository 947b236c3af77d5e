"""Alerts in from the webhook: which firing alerts are queued for the remediation loop, bounded and replay-safe.

What a webhook delivers is kept small whatever arrives: at most ``MAX_FIRING`` fingerprints queued (the oldest
goes first) and at most ``MAX_ALERT_PROBLEMS`` distinct problems (alert names) at once, so neither the memory nor
the state file (one ``onset`` per problem) grows with what a sender invents. Delivery is idempotent: Alertmanager's
repeats of an episode (same fingerprint and ``startsAt``) are ignored, and so is any firing that does not start
after the newest episode already seen for its problem, firing or resolved: a late firing after its resolved
alert, or a replay of an old one after the fingerprint memory has moved on, is never queued.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Protocol

from dgxdoctor.remediation.policy import Problem, problem_from_alert

SEEN_FINGERPRINTS = 1000
MAX_FIRING = 256
MAX_ALERT_PROBLEMS = 32
# Newest startsAt per problem key; a problem key is per alert name, so this is the replay memory's reach.
MAX_EPISODES = 1024


class FiringAlert(Protocol):
    """One alert of Alertmanager's webhook (``alerts.webhook.IncomingAlert``)."""

    @property
    def status(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def starts_at(self) -> str: ...
    @property
    def started(self) -> float | None: ...


class AlertIntake:
    def __init__(self, node: str, clock: Callable[[], float]) -> None:
        self.node = node
        self.clock = clock
        self.firing: OrderedDict[str, Problem] = OrderedDict()
        self.seen: OrderedDict[str, str] = OrderedDict()  # fingerprint -> startsAt already taken
        self.newest: OrderedDict[str, float] = OrderedDict()  # problem key -> newest startsAt seen
        self.dropped = 0  # firing alerts refused because MAX_ALERT_PROBLEMS were already queued

    def accept(self, alerts: Iterable[FiringAlert]) -> tuple[int, int]:
        """Queue the firing alerts for this node that carry an action; (accepted, ignored)."""
        accepted = ignored = 0
        for alert in alerts:
            problem = problem_from_alert(alert.labels, self.node, alert.started or self.clock())
            if alert.status == "resolved":
                self.firing.pop(alert.fingerprint, None)
                if problem is not None and alert.started is not None:
                    self._episode(problem.key, alert.started)
                ignored += 1
                continue
            if problem is None or self._replayed(alert, problem) or not self._room_for(problem):
                ignored += 1
                continue
            self._remember(alert, problem)
            accepted += 1
        return accepted, ignored

    def _replayed(self, alert: FiringAlert, problem: Problem) -> bool:
        if self.seen.get(alert.fingerprint) == alert.starts_at:
            return True  # Alertmanager repeating an episode it already delivered
        newest = self.newest.get(problem.key)
        return alert.started is not None and newest is not None and alert.started <= newest

    def _room_for(self, problem: Problem) -> bool:
        keys = {p.key for p in self.firing.values()}
        if problem.key in keys or len(keys) < MAX_ALERT_PROBLEMS:
            return True
        self.dropped += 1
        return False

    def _remember(self, alert: FiringAlert, problem: Problem) -> None:
        self.seen[alert.fingerprint] = alert.starts_at
        self.seen.move_to_end(alert.fingerprint)
        while len(self.seen) > SEEN_FINGERPRINTS:
            self.seen.popitem(last=False)
        if alert.started is not None:
            self._episode(problem.key, alert.started)
        self.firing.pop(alert.fingerprint, None)
        self.firing[alert.fingerprint] = problem
        while len(self.firing) > MAX_FIRING:
            self.firing.popitem(last=False)

    def _episode(self, key: str, started: float) -> None:
        self.newest[key] = max(started, self.newest.get(key, started))
        self.newest.move_to_end(key)
        while len(self.newest) > MAX_EPISODES:
            self.newest.popitem(last=False)

    def clear(self, key: str, action: str) -> None:
        """An action ran for ``key``: its alerts (and those asking the same action) are answered."""
        for fingerprint, problem in list(self.firing.items()):
            if problem.key == key or problem.action == action:
                del self.firing[fingerprint]

"""Every safety limit in one place: the mode, the hold time, the vLLM start-up grace, per-action cooldowns, the
budget and its breaker, one action at a time, and who orchestrates a cluster-wide action.

``GuardState`` is plain data that survives a restart (``to_doc``/``from_doc``); ``Guard.decide`` is pure given the
state, the settings and the time. The engine persists the state after every change.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

from msgspec import Struct, field, structs

from dgxdoctor.records import asdict
from dgxdoctor.remediation.policy import ActionName, Attempt, Problem, escalate
from dgxdoctor.remediation.state_doc import MAX_ACTIONS, MAX_KEYS, MAX_STEPS, validate_state
from dgxdoctor.settings.remediation import RemediationSettings

Verdict = Literal["act", "page", "suggest", "observe", "hold", "refuse"]


class Decision(Struct, frozen=True):
    verdict: Verdict
    action: ActionName
    reason: str
    problem: Problem


class InFlight(Struct):
    id: str
    action: ActionName
    key: str
    started_at: float
    pid: int

    def to_doc(self) -> dict[str, Any]:
        return structs.asdict(self)


class GuardState(Struct):
    breaker_open: bool = False
    breaker_reason: str | None = None
    breaker_opened_at: float | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)  # {"action", "at"}: the budget's window
    last: dict[str, float] = field(default_factory=dict)  # action -> start time, for cooldowns
    # the ladder: a problem's first action (restart_vllm, restart_cluster) -> what ran for it, {"action", "at"}
    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    onset: dict[str, float] = field(default_factory=dict)  # problem key -> when the condition (re)appeared
    in_flight: InFlight | None = None
    finished_at: float | None = None  # when the last action ended: results of runs before it are stale
    steps: list[dict[str, Any]] = field(default_factory=list)  # a worker's step requests: {"id", "step", "at"}
    # Observe mode recorded actions it did not run (their cooldowns, budget, ladder, breaker): act mode forgets them
    dry_run: bool = False

    def to_doc(self) -> dict[str, Any]:
        """A deep copy: comparing it with a later one shows whether anything changed."""
        return copy.deepcopy(
            {
                "version": 1,
                "breaker": {
                    "open": self.breaker_open,
                    "reason": self.breaker_reason,
                    "opened_at": self.breaker_opened_at,
                },
                "actions": self.actions,
                "last": self.last,
                "attempts": self.attempts,
                "onset": self.onset,
                "in_flight": self.in_flight.to_doc() if self.in_flight else None,
                "finished_at": self.finished_at,
                "steps": self.steps,
                # only when set: a state observe mode never rehearsed on is the format every release reads
                **({"dry_run": True} if self.dry_run else {}),
            }
        )

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> GuardState:
        """The state a document describes; ``StateDocError`` (a ValueError) when it is not exactly one."""
        if not doc:
            return cls()
        d = validate_state(doc)
        flight = d.in_flight
        return cls(
            breaker_open=d.breaker.open,
            breaker_reason=d.breaker.reason,
            breaker_opened_at=d.breaker.opened_at,
            actions=[asdict(a) for a in d.actions],
            last=dict(d.last),
            attempts={k: [asdict(a) for a in v] for k, v in d.attempts.items()},
            onset=dict(d.onset),
            in_flight=InFlight(flight.id, flight.action, flight.key, flight.started_at, flight.pid) if flight else None,
            finished_at=d.finished_at,
            steps=[asdict(s) for s in d.steps],
            dry_run=d.dry_run,
        )

    @classmethod
    def safe(cls, reason: str, now: float) -> GuardState:
        """What replaces an invalid state file: the breaker open, so nothing runs until an operator resets."""
        return cls(breaker_open=True, breaker_reason=reason[:500], breaker_opened_at=now)


def in_start_grace(settings: RemediationSettings, vllm_uptime_s: float | None) -> bool:
    """vLLM started less than ``vllm_start_grace_s`` ago (by the vllm check's uptime): no restart yet."""
    return vllm_uptime_s is not None and vllm_uptime_s < settings.vllm_start_grace_s


class Guard:
    def __init__(self, settings: RemediationSettings, state: GuardState | None = None) -> None:
        self.settings = settings
        self.state = state or GuardState()

    # -- what is seen ----------------------------------------------------------------------------------

    def observe(self, present: list[Problem], now: float, source: str) -> None:
        """Note when each present problem began; a problem of ``source`` no longer present has ended."""
        keys = {p.key for p in present}
        for problem in present:
            if problem.key not in self.state.onset and len(self.state.onset) >= MAX_KEYS:
                continue  # the state file stays bounded; the engine bounds the alert names before this
            self.state.onset.setdefault(problem.key, problem.since if problem.since is not None else now)
        for key in [k for k in self.state.onset if k.startswith(f"{source}:") and k not in keys]:
            del self.state.onset[key]

    def budget_used(self, now: float) -> int:
        window = self.settings.budget_window_s
        return sum(1 for a in self.state.actions if now - float(a.get("at", 0)) <= window)

    # -- the decision ----------------------------------------------------------------------------------

    def decide(self, problem: Problem, now: float, vllm_uptime_s: float | None) -> Decision:
        """What act mode does now: the same in both modes (observe mode is its dry run: the engine records "would
        X" where this says ``act`` or ``page``)."""
        s = self.settings
        tried = [Attempt(a["action"], float(a["at"])) for a in self.state.attempts.get(problem.action, [])]
        action = escalate(problem.action, tried, now, s.ladder_window_s)

        def out(verdict: Verdict, reason: str) -> Decision:
            return Decision(verdict, action, reason, problem)

        # An action ends the episode (``finish``): what is seen again must hold, before a restart or the ladder's page.
        held = now - self.state.onset.get(problem.key, now)
        unheld = out("hold", f"condition held {held:.0f} s of hold_s {s.hold_s:g} s") if held < s.hold_s else None
        if action == "page" and problem.action == "page":
            # Hardware and drift: the shipped alert rules page for these already; remediation only says so.
            return out("suggest", "a restart cannot fix this: an operator must (the alert rules page for it)")
        if action == "page":
            if self.state.in_flight is not None:  # whether the restart cured it is known only once it has ended
                return out("hold", f"{self.state.in_flight.action} in flight: judged again after it ends")
            if now - self.state.last.get("page", float("-inf")) < s.cooldown_s.get("page", 0.0):
                return out("hold", "page sent recently (cooldown)")
            if unheld is not None:
                return unheld
            return out("page", "the ladder ended (restarts did not cure it): page an operator")
        if self.state.breaker_open:
            return out("refuse", f"breaker open ({self.state.breaker_reason}); `dgxdoctor remediation reset`")
        if self.state.in_flight is not None:
            return out("refuse", f"{self.state.in_flight.action} in flight: one action at a time")
        if action == "restart_cluster" and s.role is None:  # observe mode only: act mode needs a role
            return out("refuse", 'no [node] role: only the head\'s agent (role = "head") orchestrates cluster restarts')
        if action == "restart_cluster" and s.role != "head":
            return out("refuse", "cluster restarts are orchestrated by the head's agent")
        if unheld is not None:
            return unheld
        if in_start_grace(s, vllm_uptime_s):
            return out("hold", f"vLLM started {vllm_uptime_s:.0f} s ago: within the {s.vllm_start_grace_s:g} s grace")
        since_last = now - self.state.last.get(action, float("-inf"))
        cooldown = s.cooldown_s.get(action, 0.0)
        if since_last < cooldown:
            return out("hold", f"{action} ran {since_last:.0f} s ago: cooldown {cooldown:g} s")
        if self.budget_used(now) >= s.budget:
            self.open_breaker(f"budget of {s.budget} actions per {s.budget_window_s:g} s spent", now)
            return out("refuse", f"breaker opened: {self.state.breaker_reason}")
        return out("act", f"{problem.reason} held {held:.0f} s")

    def decide_planned(self, problem: Problem, now: float) -> Decision:
        """An operator's planned restart (``dgxdoctor remediation restart``): act mode only, never beside another
        action, within the budget and its breaker. No hold, start grace or cooldown: a person asked for it now."""
        s = self.settings

        def out(verdict: Verdict, reason: str) -> Decision:
            return Decision(verdict, problem.action, reason, problem)

        if s.mode != "act":
            return out("refuse", 'mode = "observe": nothing runs (set [remediation] mode = "act")')
        if self.state.breaker_open:
            return out("refuse", f"breaker open ({self.state.breaker_reason}); `dgxdoctor remediation reset`")
        if self.state.in_flight is not None:
            return out("refuse", f"{self.state.in_flight.action} in flight: one action at a time")
        if self.budget_used(now) >= s.budget:
            return out("refuse", f"the budget of {s.budget} actions per {s.budget_window_s:g} s is spent")
        return out("act", problem.reason)

    def next_change(self, now: float) -> float:
        """The earliest time, from ``now`` on, at which a decision over this state may change with time alone: a
        hold, a cooldown, the budget's or the ladder's window running out (inf: none). Every time ``decide`` and
        ``escalate`` compare with is here, whichever problem it belongs to: a later evaluation is due by then."""
        s, st = self.settings, self.state
        times = [at + s.hold_s for at in st.onset.values()]
        cooldowns: dict[str, float] = {str(action): s_ for action, s_ in s.cooldown_s.items()}
        times += [at + cooldowns.get(action, 0.0) for action, at in st.last.items()]
        times += [float(a["at"]) + s.budget_window_s for a in st.actions]
        times += [float(a["at"]) + s.ladder_window_s for kept in st.attempts.values() for a in kept]
        return min((t for t in times if t >= now), default=math.inf)

    # -- bookkeeping -----------------------------------------------------------------------------------

    def open_breaker(self, reason: str, now: float) -> None:
        self.state.breaker_open = True
        self.state.breaker_reason = reason[:500]
        self.state.breaker_opened_at = now

    def admit_step(self, action_id: str, step: str, sent_at: float, now: float, window_s: float) -> str | None:
        """A worker's step asked by the head: None (remembered, the action counted in this node's budget) or why it
        is refused. Each (action, step) runs once; a request older (or newer) than ``window_s`` is refused, so a
        recorded request replayed later never runs, and the remembered ones stay bounded."""
        st = self.state
        st.steps = [x for x in st.steps if now - float(x["at"]) <= window_s][-MAX_STEPS:]
        if abs(now - sent_at) > window_s:
            return f"request sent {now - sent_at:.0f} s ago, outside the {window_s:g} s window (a replay or clock skew)"
        if any(x["id"] == action_id and x["step"] == step for x in st.steps):
            return f"{step} of action {action_id} already ran here: a replay"
        if st.breaker_open:
            return f"breaker open ({st.breaker_reason}); `dgxdoctor remediation reset` on this node"
        if not any(x["id"] == action_id for x in st.steps):  # the first step of a cluster restart spends budget
            if self.budget_used(now) >= self.settings.budget:
                self.open_breaker(f"budget of {self.settings.budget} actions per {self.settings.budget_window_s:g} s "
                                  "spent", now)  # fmt: skip
                return f"breaker opened: {st.breaker_reason}"
            window = self.settings.budget_window_s
            st.actions = [a for a in st.actions if now - float(a["at"]) <= window]
            st.actions = [*st.actions, {"action": "restart_cluster", "at": now}][-MAX_ACTIONS:]
        st.steps = [*st.steps, {"id": action_id, "step": step, "at": sent_at}][-MAX_STEPS:]
        return None

    def begin(self, decision: Decision, action_id: str, now: float, pid: int, ladder: bool = True) -> None:
        """``ladder`` False: an operator's planned restart, no step of any problem's ladder."""
        st = self.state
        st.in_flight = InFlight(action_id, decision.action, decision.problem.key, now, pid)
        st.actions = [a for a in st.actions if now - float(a["at"]) <= self.settings.budget_window_s]
        st.actions = [*st.actions, {"action": decision.action, "at": now}][-MAX_ACTIONS:]
        st.last[decision.action] = now
        if ladder:
            self._attempt(decision.problem.action, decision.action, now)

    def paged(self, decision: Decision, now: float) -> None:
        self.state.last["page"] = now
        self._attempt(decision.problem.action, "page", now)

    def _attempt(self, problem_action: ActionName, action: ActionName, now: float) -> None:
        """The ladder remembers only its window (and at most ``MAX_ACTIONS`` steps), so the file stays bounded."""
        window = self.settings.ladder_window_s
        kept = [a for a in self.state.attempts.get(problem_action, []) if now - float(a["at"]) <= window]
        self.state.attempts[problem_action] = [*kept, {"action": action, "at": now}][-MAX_ACTIONS:]

    def finish(self, now: float, ran: bool = True) -> None:
        """The action ended (either way): the problem's episode ends, a recurrence must hold again. An action whose
        command could not run (``ran`` False) cured nothing and tried nothing: it leaves the ladder where it was (its
        budget and cooldown stay spent), so the next step is the same action, not an escalation."""
        flight = self.state.in_flight
        self.state.in_flight = None
        self.state.finished_at = now
        if flight is None:
            return
        self.state.onset.pop(flight.key, None)
        if not ran:
            tried = {"action": flight.action, "at": flight.started_at}
            for first, kept in list(self.state.attempts.items()):
                self.state.attempts[first] = [a for a in kept if a != tried]

    def rehearse(self, decision: Decision, now: float) -> None:
        """Observe mode, where act mode would run ``decision``: the state as if it ran and ended at once without
        curing anything (the world is untouched): its budget, cooldown and ladder step spent, the episode ended. So
        the dry run meets the holds, cooldowns, ladder and breaker act mode would meet. Marked ``dry_run``."""
        if decision.verdict == "page":
            self.paged(decision, now)
        else:
            self.begin(decision, "0", now, 0)
            self.finish(now)
        self.state.dry_run = True

    def forget_dry_run(self) -> bool:
        """Act mode over a state that observe mode rehearsed on: what never ran is forgotten (as ``reset``); True
        when there was something to forget."""
        if not self.state.dry_run:
            return False
        self.reset()
        return True

    def reset(self) -> None:
        """``dgxdoctor remediation reset``: breaker closed, budget, ladder and cooldowns forgotten."""
        self.state = GuardState(
            in_flight=self.state.in_flight, finished_at=self.state.finished_at, steps=self.state.steps
        )

"""The remediation loop in the daemon: findings and alerts in, the guard's decisions, the actions, the audit.

Findings come from the result store (the checks' latest results), alerts from the webhook (queued, deduplicated
per fingerprint). A loop re-evaluates every ``TICK_S`` and at once when something arrives. Decisions are audited
when they change; an action runs in a worker thread, one at a time, its start and end both written to the audit
and the guard's state before and after. When the agent stops, an action running ends at its next step or poll
and is audited "interrupted" (``stop``). A worker's agent runs its part of a cluster restart only when the head
asks (``run_step``).

Observe mode is act mode's dry run on the same path: the same decisions at the same evaluations; where act mode
would run an action or send a page, it audits "would X", runs and sends nothing, and the guard's state moves as if
the action had run and ended at once (``Guard.rehearse``). A restart whose command could not run is said so and
paged at once; it is no step of the ladder (``could_not_run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, get_args

import httpx
from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor import eventlog
from dgxdoctor.compat import aio
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.breaker import FleetHealth, FleetReading, FleetView, fleet_health
from dgxdoctor.remediation.actions import (
    Deadline,
    StepResult,
    VllmTarget,
    ask_worker,
    drain_vllm,
    port_impostor,
    run_argv,
    verify_vllm,
    wait_ray,
)
from dgxdoctor.remediation.audit import AUDIT_FILE, STATE_FILE, AuditLog, Throttle, WriteErrors, guard_state_file
from dgxdoctor.remediation.capture import PreActionCapture
from dgxdoctor.remediation.fleet_gate import FleetGate
from dgxdoctor.remediation.guard import Decision, Guard, GuardState, in_start_grace
from dgxdoctor.remediation.hardware_gate import HardwareCause, HardwareGate, causes
from dgxdoctor.remediation.intake import AlertIntake, FiringAlert
from dgxdoctor.remediation.policy import OLD_EVIDENCE, RESTARTS, Problem, fresh_alert, problems_from_results
from dgxdoctor.remediation.rotation import DEAD_CODES, HUNG_CODES, Rotation
from dgxdoctor.remediation.settled import Moment, Settled, View, file_stamp
from dgxdoctor.remediation.state_doc import Step
from dgxdoctor.remediation.worker import WorkerSteps
from dgxdoctor.result import CheckResult, Finding
from dgxdoctor.settings.remediation import RemediationSettings
from dgxdoctor.sources.statefile import StateFile

log = eventlog.get_logger(__name__)

TICK_S = 1.0
# At stop, how long an action running is given to end at its next step or poll (the daemon exits within 10 s);
# one still inside a command then is left in flight, and recorded as interrupted at the next start (``recover``).
STOP_WAIT_S = 5.0
INTERRUPTED = "interrupted"  # the step that ends an action the agent's stop cut short
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
UPTIME_METRIC = "dgxdoctor_vllm_process_uptime_seconds"
# Every (action, outcome) ``counts`` can hold: dgxdoctor_remediation_actions_total exports each at 0 from the start,
# so that the first failed restart is an increase (DgxdoctorRemediationFailed). 21 series per node.
ACTION_OUTCOMES: tuple[tuple[str, str], ...] = (
    *((action, outcome) for action in RESTARTS for outcome in ("success", "failed", INTERRUPTED)),
    *(("page", outcome) for outcome in ("sent", "logged", "failed")),
    *((step, outcome) for step in get_args(Step) for outcome in ("success", "failed", "refused")),
)
__all__ = ["FiringAlert", "Remediator", "Targets"]


# One step of an action, its arguments bound; blocks (run in the action's thread).
StepCall = Callable[[], StepResult]
# (node, problem, suggested action, reason, now) -> what happened; raises when the page could not be delivered.
Pager = Callable[[str, str, str, str, float], str]


class Targets(Struct, frozen=True):
    """What the actions work on, from the vllm and ray checks' settings and the daemon's peers and token."""

    vllm: VllmTarget
    ray_dashboard_url: str
    ray_nodes: int
    ray_gpus: int
    workers: tuple[str, ...]
    token: str | None
    executor: str | None = None  # [node] executor: "mp" restarts in the mp order, else the Ray order


class Interrupted(Exception):
    """The agent is stopping: the action ends where it is, with the steps it ran."""

    def __init__(self, steps: list[StepResult]) -> None:
        super().__init__("the agent stopped")
        self.steps = steps


def _fleet_moment(fleet: FleetHealth | None) -> str:
    """What of the fleet's verdict is judged again when it changes: why it tripped, and what the view could not
    read, without the age of what it kept ("412 s" ticking is no change)."""
    if fleet is None:
        return ""
    steady = _NUMBER.sub("#", fleet.unknown)
    reason = fleet.reason.replace(fleet.unknown, steady) if fleet.tripped and fleet.unknown else fleet.reason
    return (reason if fleet.tripped else "") + steady


def vllm_uptime(results: dict[str, CheckResult]) -> float | None:
    result = results.get("vllm")
    if result is None:
        return None
    return next((s.value for s in result.samples if s.metric.name == UPTIME_METRIC), None)


class Remediator:
    def __init__(
        self,
        settings: RemediationSettings,
        pager: Pager | None,
        node: str,
        state_dir: Path,
        targets: Targets,
        latest: Callable[[], dict[str, CheckResult]],
        clock: Callable[[], float] = time.time,
        env: Environment | None = None,
        state_file: StateFile | None = None,
        fleet: FleetView | None = None,
    ) -> None:
        # HTTP (capped clients, one TLS context) and commands (in /) go through the environment's seams; tests
        # inject an httpx transport and a runner there.
        self.env = env if env is not None else Environment(node=node)
        self.settings = settings
        self.pager = pager
        self.node = node
        self.targets = targets
        self.latest = latest
        self.clock = clock
        self.audit = AuditLog(state_dir)
        self.state_file = state_file if state_file is not None else guard_state_file(state_dir)
        self.write_errors = WriteErrors()
        self.loop_errors = Throttle()
        self.counts: Counter[tuple[str, str]] = Counter(dict.fromkeys(ACTION_OUTCOMES, 0))
        self.breaker_open = False
        self.finished_at: float | None = None
        self.idle = False  # True once an evaluation found no problem and nothing in flight
        self.intake = AlertIntake(node, clock)
        self.last_decision: dict[str, tuple[str, str]] = {}
        # Why remediation cannot act at all (the state file was invalid and set aside, or cannot be read); None: it can
        self.disabled: str | None = None
        self.state_invalid = 0  # invalid state files set aside since start
        self.alerts_held = 0  # firing alerts held on old evidence (OLD_EVIDENCE), once per episode
        # An action whose end could not be saved (the disk refused): (id, when it ended), saved at the next evaluation
        self.pending_finish: tuple[str, float] | None = None
        self.not_run: str | None = None  # the id of the last action whose command could not run (no ladder step)
        self.worker = WorkerSteps(self)
        self.wake = asyncio.Event()
        self.busy = asyncio.Lock()
        self.task: asyncio.Task[None] | None = None
        self.acting: asyncio.Task[Any] | None = None  # the action running, if any (``stop`` ends it)
        self.stopping = threading.Event()  # set by ``stop``: seen by the action's thread between steps and polls
        self.capture: PreActionCapture | None = None  # act mode: the evidence, taken before a restart runs
        self.planned_bundles: dict[str, Path] = {}  # action id -> where its capture goes (named before it runs)
        self.gate = HardwareGate()  # no restart while a hardware cause is active (remediation/hardware_gate.py)
        # The cluster view (the daemon's peer states, or Prometheus's) for the fleet breaker; None: this node alone.
        self.fleet = fleet
        self.fleet_gate = FleetGate()  # no restart while too much of the fleet is unhealthy (fleet_gate.py)
        self.fleet_reason = ""  # why the fleet breaker is tripped at the last evaluation ("" when it is not)
        # Hardware causes relayed from beyond this node's results (with Prometheus as the cluster view: the critical
        # findings of the other nodes of this node's serving group, judged); None: only the results' own.
        self.relayed: Callable[[], Sequence[Finding]] | None = None
        self.settled: Settled | None = None  # what the last evaluation that changed nothing saw (settled.py)
        self.rotation = Rotation()  # out of the balancer's rotation while a restart drains and runs (rotation.py)

    @property
    def firing(self) -> dict[str, Problem]:
        return self.intake.firing

    # -- state -----------------------------------------------------------------------------------------

    def load_guard(self) -> Guard:
        """The guard over the state on disk. An invalid file is set aside and replaced by the safe state (breaker
        open): never a crash, never a silent reset. An unreadable one (OSError) raises: nothing can be decided."""
        try:
            doc = self.state_file.read()
        except OSError as exc:
            self.disabled = f"state file unreadable: {type(exc).__name__}: {exc}"[:300]
            raise
        except ValueError as exc:
            return self._set_aside(exc)
        try:
            guard = Guard(self.settings, GuardState.from_doc(doc))
        except ValueError as exc:
            return self._set_aside(exc)
        if self.settings.mode == "act" and guard.forget_dry_run():
            self._forgot_dry_run(guard)
        return guard

    def _forgot_dry_run(self, guard: Guard) -> None:
        """Act mode found what observe mode rehearsed: never run, so it spends no budget, cooldown or ladder step
        of act mode's (and a breaker it opened is closed). Written at once; audited as a reset."""
        self.state_file.write(guard.state.to_doc())
        detail = ('mode = "act": the actions observe mode rehearsed (their budget, cooldowns, ladder steps and any '
                  "breaker they opened) are forgotten: they never ran")  # fmt: skip
        self.audit_record({"ts": self.clock(), "event": "reset", "by": "mode change", "detail": detail})
        log.info("remediation_dry_run_forgotten", detail=detail)

    def _set_aside(self, exc: ValueError) -> Guard:
        now = self.clock()
        self.disabled = f"the state file is invalid: {str(exc)[:200]}"  # stays so if it cannot even be set aside
        kept = self.state_file.set_aside(now)
        reason = f"the state file was invalid ({str(exc)[:200]}), kept as {kept.name}"
        guard = Guard(self.settings, GuardState.safe(reason, now))
        self.state_file.write(guard.state.to_doc())
        self.state_invalid += 1
        self.disabled = reason
        self.audit_record({"ts": now, "event": "state_invalid", "error": str(exc)[:300], "kept_as": str(kept),
                     "detail": "replaced by a state with the breaker open: nothing runs until `dgxdoctor remediation "
                     "reset`"})  # fmt: skip
        log.error("remediation_state_invalid", error=str(exc)[:300], kept_as=str(kept), breaker="open")
        return guard

    def _save(self, guard: Guard, before: dict[str, Any]) -> None:
        doc = guard.state.to_doc()
        if doc != before:
            self.state_file.write(doc)
        self.breaker_open = guard.state.breaker_open
        self.finished_at = guard.state.finished_at
        self.idle = not guard.state.onset and guard.state.in_flight is None
        if not guard.state.breaker_open:
            self.disabled = None  # an operator's reset (or a good file) brings it back

    def store_guard(self, guard: Guard, before: dict[str, Any]) -> bool:
        """``_save``; False (counted, logged at a bounded rate) when the disk refuses."""
        try:
            self._save(guard, before)
        except OSError as exc:
            self.write_errors.failed(STATE_FILE, self.state_file.path, exc, "no action starts until it can be saved")
            return False
        return True

    def audit_record(self, record: dict[str, Any]) -> bool:
        """Append to the audit; False (counted, logged at a bounded rate) when the disk refuses."""
        try:
            self.audit.append(record)
        except OSError as exc:
            self.write_errors.failed(AUDIT_FILE, self.audit.path, exc, "no action starts until it can be audited")
            return False
        return True

    def recover(self) -> None:
        """At start: an action that was in flight when the agent died is recorded as interrupted, not repeated."""
        if not self.state_file.path.exists():
            return  # nothing ever decided here
        with self.state_file.locked():
            guard = self.load_guard()
            before = guard.state.to_doc()
            flight = guard.state.in_flight
            if flight is not None:
                self.audit_record(
                    {"ts": self.clock(), "event": "action", "id": flight.id, "action": flight.action,
                     "problem": flight.key, "mode": "act", "outcome": "interrupted",
                     "detail": f"the agent (pid {flight.pid}) stopped while it ran; not repeated: the condition must "
                     "hold again, the cooldown and the ladder apply", "started_at": flight.started_at}
                )  # fmt: skip
                self.counts[(flight.action, "interrupted")] += 1
                guard.finish(self.clock())
                log.warning("remediation_interrupted", action=flight.action, id=flight.id)
            self._save(guard, before)

    # -- input -----------------------------------------------------------------------------------------

    def accept_alerts(self, alerts: Iterable[FiringAlert]) -> tuple[int, int]:
        """Webhook alerts: queue those for this node that carry an action; (accepted, ignored)."""
        self.intake.node = self.node
        accepted, ignored = self.intake.accept(alerts)
        if accepted:
            self.wake.set()
        return accepted, ignored

    def poke(self) -> None:
        self.wake.set()

    # -- the loop --------------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.recover()
        except OSError as exc:  # an unwritable or unreadable state_dir: say so, keep serving
            self.disabled = self.disabled or f"state unusable: {type(exc).__name__}: {exc}"[:300]
            log.error("remediation_state_unreadable", error=f"{type(exc).__name__}: {exc}")
        self.stopping.clear()
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """No new action; the one running ends at its next step or poll, audited "interrupted", nothing left in
        flight, so the audit says at once how it ended. Its thread is not left running for an event loop that closes
        after this (``asyncio.run`` joins it) to wait on for the rest of the action (Ray's readiness: 300 s)."""
        self.stopping.set()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        acting = self.acting
        if acting is not None and not acting.done():
            await asyncio.wait({acting}, timeout=STOP_WAIT_S)
            if not acting.done():
                why = "a command still runs: left in flight, recorded as interrupted at the next start"
                log.warning("remediation_stop_action_running", wait_s=STOP_WAIT_S, detail=why)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await aio.wait_for(self.wake.wait(), TICK_S)
            self.wake.clear()
            try:
                await self.evaluate()
            except Exception as exc:  # a bad state file or disk must not stop the daemon; said once a minute
                say, quiet = self.loop_errors.say(type(exc).__name__)
                if say:
                    log.error("remediation_evaluate_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                              not_logged_since=quiet, disabled=self.disabled)  # fmt: skip

    def _problems(self, latest: dict[str, CheckResult]) -> tuple[list[Problem], list[Problem]]:
        """(from the checks, from the alerts), both without what describes the world before the last action
        (an alert's evidence: ``policy.fresh_alert``)."""
        after = self.finished_at
        alerts = list({p.key: p for p in self.firing.values() if fresh_alert(p, latest, after)}.values())
        fresh = [r for r in latest.values() if self.finished_at is None or r.started_at > self.finished_at]
        return problems_from_results(fresh, self.finished_at), alerts

    def _hold_old_alerts(self, fresh: list[Problem], now: float) -> list[Problem]:
        """The firing alerts not taken as reasons (``_problems``: their evidence predates the last action), each
        audited as held (once per episode: ``_audit_decision``)."""
        taken = {p.key for p in fresh}
        held = list({p.key: p for p in self.firing.values() if p.key not in taken}.values())
        for problem in held:
            if self._audit_decision(Decision("hold", problem.action, OLD_EVIDENCE, problem), now):
                self.alerts_held += 1
        return held

    def _moment(self) -> Moment:
        return Moment(dict(self.firing), file_stamp(self.state_file.path), self.finished_at, self.pending_finish,
                      self.idle, self.breaker_open, self.busy.locked(), self.settings, self.node,
                      self.fleet_reason)  # fmt: skip

    def fleet_health(self) -> FleetHealth | None:
        """The fleet breaker's verdict over the cluster view now; None without a view (or when it fails: said)."""
        if self.fleet is None:
            return None
        s = self.settings
        try:
            got = self.fleet()
        except Exception as exc:  # the view is the daemon's own memory; a bug there must not stop remediation
            say, quiet = self.loop_errors.say(f"fleet:{type(exc).__name__}")
            if say:
                log.error("remediation_fleet_view_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                          not_logged_since=quiet)  # fmt: skip
            return None
        members, unknown = (got.members, got.unknown) if isinstance(got, FleetReading) else (got, "")
        return fleet_health(members, s.fleet_breaker_fraction, s.fleet_breaker_min_nodes, s.fleet_breaker_min_groups,
                            unknown)  # fmt: skip

    def causes(self, latest: dict[str, CheckResult]) -> list[HardwareCause]:
        """The hardware causes now: this node's results' and the relayed ones (a failing relay: said, none)."""
        relayed: Sequence[Finding] = ()
        if self.relayed is not None:
            try:
                relayed = self.relayed()
            except Exception as exc:  # the daemon's own memory, as the fleet view
                say, quiet = self.loop_errors.say(f"relayed:{type(exc).__name__}")
                if say:
                    log.error("remediation_relayed_causes_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                              not_logged_since=quiet)  # fmt: skip
        return causes(latest, self.node, relayed)

    def _view(self, latest: dict[str, CheckResult]) -> View:
        checks, alerts = self._problems(latest)
        uptime = vllm_uptime(latest)
        grace = in_start_grace(self.settings, uptime) if uptime is not None else None
        return View(tuple(checks), tuple(self.causes(latest)), grace, tuple(alerts))

    def _unchanged(self, latest: dict[str, CheckResult], now: float, moment: Moment) -> bool:
        """Whether this evaluation would decide what the last settled one did (settled.py): then it is skipped."""
        settled = self.settled
        if settled is None or not settled.holds(now, moment):
            return False
        if not settled.same_results(latest):
            if self._view(latest) != settled.view:
                return False
            settled.results = dict(latest)  # new runs saying the same: not looked into again
        elif self.relayed is not None and tuple(self.causes(latest)) != settled.view.causes:
            return False  # a cause relayed from beyond the results came or went
        return True

    def _settle(self, latest: dict[str, CheckResult], before: Moment, until: float) -> None:
        """Keep what this evaluation saw when it wrote nothing (the state file is the one it read): the next ones
        are skipped while it all holds. Called under the state file's lock."""
        after = self._moment()
        if after.stamp == before.stamp:
            self.settled = Settled(latest, self._view(latest), after, until)

    def _read_fleet(self) -> FleetHealth | None:
        """The fleet's health now; the breaker's metric follows it, with or without a problem here."""
        fleet = self.fleet_health()
        self.fleet_gate.health = fleet
        self.fleet_reason = _fleet_moment(fleet)
        return fleet

    async def evaluate(self) -> None:
        now = self.clock()
        latest = self.latest()
        fleet = self._read_fleet()
        moment = self._moment()
        if self._unchanged(latest, now, moment):
            return
        self.settled = None
        checks, alerts = self._problems(latest)
        self._forget_ended(checks + alerts + self._hold_old_alerts(alerts, now), causes(latest, self.node))
        quiet = self.idle and not self.breaker_open and self.pending_finish is None
        if not checks and not alerts and quiet:
            self.settled = Settled(latest, self._view(latest), moment, math.inf)
            return  # nothing seen now or at the last evaluation: no state to touch
        with self.state_file.locked():
            guard = self.load_guard()
            before = guard.state.to_doc()
            self._apply_pending_finish(guard)
            if guard.state.finished_at != self.finished_at:  # changed on disk (another process): judge again
                self.finished_at = guard.state.finished_at
                checks, alerts = self._problems(latest)
            guard.observe(checks, now, "check")
            guard.observe(alerts, now, "alert")
            decisions = [guard.decide(p, now, vllm_uptime(latest)) for p in checks + alerts]
            decisions, pages = self.gate.apply(decisions, self.causes(latest), self.node)
            decisions, fleet_pages = self.fleet_gate.apply(decisions, fleet)
            pages += fleet_pages
            decisions, chosen = _one_at_a_time(decisions)
            dry = self.settings.mode == "observe"  # the dry run of act mode: the same decisions, nothing runs
            for decision in decisions:
                self._audit_decision(_would(decision) if dry and decision is chosen else decision, now)
            action_id = uuid.uuid4().hex[:12]
            acting = chosen is not None and chosen.verdict == "act" and not self.busy.locked()
            if dry and chosen is not None:
                # Where act mode would run it: as if it ran and ended now, curing nothing (guard.rehearse)
                acting = False
                guard.rehearse(chosen, now)
                if chosen.verdict == "act":
                    self.intake.clear(chosen.problem.key, chosen.problem.action)
            elif acting and chosen is not None:
                # The audit first: an action it cannot record never starts, and leaves nothing in flight.
                acting = self.audit_record(self._started_record(chosen, action_id, now))
                if acting:
                    guard.begin(chosen, action_id, now, os.getpid())
            elif chosen is not None and chosen.verdict == "page":
                guard.paged(chosen, now)
            saved = self.store_guard(guard, before)
            if saved and self.pending_finish is not None and guard.state.in_flight is None:
                self.pending_finish = None
            if saved and chosen is None and not pages and guard.state.in_flight is None and not self.busy.locked():
                self._settle(latest, moment, guard.next_change(now))
        if acting and saved and chosen is not None:
            self.acting = asyncio.get_running_loop().create_task(self._act(chosen, action_id, now))
        elif acting and chosen is not None:
            self.audit_record(self._not_started_record(chosen, action_id, now))
        elif chosen is not None and chosen.verdict == "page" and saved:
            await self._page(chosen, now)
        for page in pages:
            await self._page(page, now)

    def _forget_ended(self, present: list[Problem], active: list[HardwareCause]) -> None:
        """An episode that ended is forgotten, so the next one is audited and paged afresh: the last decision of a
        problem no longer seen, the gate's page for a cause no longer active. Done before the quiet return below,
        which skips the gate: a fault fixed and back on the same port or GPU was otherwise neither re-audited (a
        "suggest" the same as the last) nor paged by the gate."""
        keys = {p.key for p in present}
        for key in [k for k in self.last_decision if k not in keys]:
            del self.last_decision[key]
        self.gate.forget({c.key for c in active})

    def _apply_pending_finish(self, guard: Guard) -> None:
        pending = self.pending_finish
        flight = guard.state.in_flight
        if pending is not None and flight is not None and flight.id == pending[0]:
            guard.finish(pending[1], ran=pending[0] != self.not_run)

    def _started_record(self, d: Decision, action_id: str, now: float) -> dict[str, Any]:
        """Written before anything runs; names the bundle the capture will write (its outcome is in the end line)."""
        try:
            planned = self.capture.planned(d.action, action_id) if self.capture else None
        except Exception:  # the capture says why when it runs; the action is never held up by it
            planned = None
        self.planned_bundles = {action_id: planned} if planned else {}
        return {"ts": now, "event": "action_started", "id": action_id, "action": d.action,
                "problem": d.problem.key, "mode": "act", "pid": os.getpid(),
                **({"bundle": str(planned)} if planned else {})}  # fmt: skip

    def _not_started_record(self, d: Decision, action_id: str, now: float) -> dict[str, Any]:
        return {"ts": now, "event": "action", "id": action_id, "action": d.action, "problem": d.problem.key,
                "mode": "act", "outcome": "not_started", "steps": [], "duration_s": 0.0,
                "detail": "the state file could not be written: not run"}  # fmt: skip

    def _audit_decision(self, d: Decision, now: float) -> bool:
        """Write the decision unless it repeats the problem's last one (a hold, a refusal); True when written."""
        shown = (d.verdict, _NUMBER.sub("#", d.reason))  # "held 3 s" and "held 4 s" are the same decision
        key = d.problem.key
        if self.last_decision.get(key) == shown and d.verdict not in ("act", "page", "observe"):
            return False
        self.last_decision[key] = shown
        self.audit_record(
            {"ts": now, "event": "decision", "problem": key, "source": d.problem.source, "seen": d.problem.reason,
             "rule": d.problem.action, "action": d.action, "verdict": d.verdict, "reason": d.reason,
             "mode": self.settings.mode}
        )  # fmt: skip
        log.info("remediation_decision", problem=key, action=d.action, verdict=d.verdict, reason=d.reason)
        return True

    # -- acting ----------------------------------------------------------------------------------------

    async def _act(
        self, decision: Decision, action_id: str, started: float, drain: bool | None = None
    ) -> dict[str, Any]:
        """Run the action (after the drain, when on) and audit its end; returns the audit's action record."""
        drain = self.settings.drain if drain is None else drain
        async with self.busy:
            planned = self.planned_bundles.pop(action_id, None)
            evidence: dict[str, Any] = {}
            try:
                steps = await asyncio.to_thread(self._leave_and_drain, decision.problem) if drain else []
            except Interrupted as stopped:
                steps = [*stopped.steps, StepResult(INTERRUPTED, False, "the agent stopped: the action ended here", 0)]
            try:
                if not steps or steps[-1].step != INTERRUPTED:
                    # The evidence after the drain: what is captured is the engine that ran, not requests cut short
                    evidence = await self.capture.before(decision.action, action_id, planned) if self.capture else {}
                    if drain:
                        self.rotation.hold("restarting")
                    steps += await asyncio.to_thread(self._execute, decision.action, action_id)
                    if drain and steps[-1].step != INTERRUPTED:
                        steps.append(await asyncio.to_thread(self._rejoin, steps))
            finally:
                self.rotation.release()
            ok = all(s.ok for s in steps if not s.step.startswith("stop")) and bool(steps)
            interrupted = bool(steps) and steps[-1].step == INTERRUPTED
            outcome = "interrupted" if interrupted else "success" if ok else "failed"
            if interrupted:
                evidence = {**evidence, "detail": "the agent stopped while it ran; not repeated: the condition must "
                            "hold again, the cooldown and the ladder apply"}  # fmt: skip
            verification = next((s.to_doc() for s in steps if s.step == "verify"), None)
            unrun = None if interrupted else could_not_run(decision.action, steps)
            end = self.clock()
            record = {"ts": end, "event": "action", "id": action_id, "action": decision.action,
                      "problem": decision.problem.key, "seen": decision.problem.reason, "mode": "act",
                      "steps": [s.to_doc() for s in steps], "verification": verification, "outcome": outcome,
                      "duration_s": round(end - started, 3), "drained": drain, **evidence,
                      **({"detail": unrun} if unrun else {})}  # fmt: skip
            self.audit_record(record)
            self.counts[(decision.action, outcome)] += 1
            self.intake.clear(decision.problem.key, decision.problem.action)
            if unrun is not None:
                self.not_run = action_id
            self._finish(action_id, end)
            log.info("remediation_action", action=decision.action, outcome=outcome, duration_s=round(end - started, 3),
                     **({"detail": unrun} if unrun else {}))  # fmt: skip
            if unrun is not None:
                # Not "restarts did not cure it": nothing was restarted. Said at once, whatever the page cooldown.
                await self._page(Decision("page", decision.action, unrun, decision.problem), end)
        self.wake.set()
        return record

    # -- out of rotation -------------------------------------------------------------------------------

    def _leave_and_drain(self, problem: Problem) -> list[StepResult]:
        """Leave rotation (/ready 503, agent ``drain``), then wait for the balancer to stop sending and vLLM's
        requests to finish. A hung engine cannot finish them: wait the balancer's period only, and say so."""
        s = self.settings
        t0 = time.monotonic()
        self.rotation.hold("draining")
        steps = [StepResult("leave_rotation", True, "out of rotation: /ready 503, agent-check drain", 0.0)]
        try:
            if problem.code in DEAD_CODES:
                why = f"{problem.code}: vLLM is gone, nothing in flight to wait for"
                step, outcome = StepResult("drain", True, why, time.monotonic() - t0), "dead"
            elif (hung := self._hung(problem)) is not None:
                self._pause(s.balancer_period_s)
                why = (f"{hung}: the engine is hung and cannot drain; waited the balancer's period "
                       f"({s.balancer_period_s:g} s), restarting without waiting for in-flight requests")  # fmt: skip
                step, outcome = StepResult("drain", True, why, time.monotonic() - t0), "hung"
            else:
                with self.env.http_client() as client:
                    step, outcome = drain_vllm(self.targets.vllm, s.drain_timeout_s, s.balancer_period_s, client,
                                               self._pause)  # fmt: skip
        except Interrupted:
            raise Interrupted(steps) from None
        self.rotation.drained(outcome, time.monotonic() - t0)
        log.info("remediation_drain", outcome=outcome, detail=step.detail)
        return [*steps, step]

    def _hung(self, problem: Problem) -> str | None:
        """The code saying the engine cannot finish what it holds: the problem's own, or (a cluster restart for a
        dead Ray node, an alert) the vllm check's latest result's."""
        if problem.code in HUNG_CODES:
            return problem.code
        vllm = self.latest().get("vllm")
        return next((f.code for f in (vllm.findings if vllm else ()) if f.code in HUNG_CODES), None)

    def _rejoin(self, steps: list[StepResult]) -> StepResult:
        """After a verified restart: release the hold and wait until the readiness signal says ready again (its
        good evaluations, each a fresh vllm check run). After a failed one: released, the checks decide."""
        t0 = time.monotonic()
        verified = any(x.step == "verify" and x.ok for x in steps)
        self.rotation.release()
        if not verified:
            return StepResult("rejoin", True, "not verified: left to the readiness checks", 0.0)
        if self.rotation.ready is None:
            return StepResult("rejoin", True, "in rotation (no readiness signal here)", 0.0)
        deadline = Deadline(self.settings.rejoin_timeout_s)
        while True:
            state = self.rotation.ready()
            if state == "ready":
                return StepResult("rejoin", True, f"ready again after {time.monotonic() - t0:.1f} s",
                                  time.monotonic() - t0)  # fmt: skip
            if deadline.left <= 0:
                why = f"not ready within rejoin_timeout_s {self.settings.rejoin_timeout_s:g} s (readiness: {state})"
                return StepResult("rejoin", False, why, time.monotonic() - t0)
            try:
                self._pause(0.25)
            except Interrupted:
                return StepResult("rejoin", False, "the agent stopped while waiting", time.monotonic() - t0)

    def _finish(self, action_id: str, end: float) -> None:
        """Clear the action in flight; when the disk refuses, the end is kept and saved by a later evaluation."""
        self.pending_finish = (action_id, end)
        try:
            with self.state_file.locked():
                guard = self.load_guard()
                before = guard.state.to_doc()
                self._apply_pending_finish(guard)
                self._save(guard, before)
        except OSError as exc:
            self.write_errors.failed(STATE_FILE, self.state_file.path, exc, "the action's end is saved once it can")
            return
        self.pending_finish = None

    def _execute(self, action: str, action_id: str) -> list[StepResult]:
        """The action's steps; when the agent's stop ended them early, the last is ``INTERRUPTED``."""
        cmd, timeout = self.settings.commands, self.settings.command_timeout_s
        with self.env.http_client(peer=True) as client:  # https:// workers: verified as peers (sources.tls)
            vllm, env = self.targets.vllm, self.env
            impostor = partial(port_impostor, vllm, env.proc_root, env.serving_uid, env.container, env.run_command)
            verify = partial(verify_vllm, vllm, self.settings.verify_timeout_s, client, self._pause, impostor)
            try:
                if self.targets.executor == "mp":
                    # Either restart is the whole mp deployment: a head restarted alone leaves the headless workers
                    # in a process group that no longer exists (docs/remediation.md).
                    return self._mp_steps(action_id, client, verify)
                if action == "restart_vllm":
                    restart = partial(
                        run_argv, "restart_vllm", cmd.vllm("restart", env.container), timeout, env.run_command
                    )
                    return self._run_steps([], [restart, verify])
                return self._cluster_steps(action_id, client, verify)
            except Interrupted as stopped:
                return [*stopped.steps, StepResult(INTERRUPTED, False, "the agent stopped: the action ended here", 0.0)]

    def _run_steps(self, stops: list[StepCall], starts: list[StepCall]) -> list[StepResult]:
        """Stops are best effort; starts run in order until one fails (the verification is the last). A stopping
        agent ends the sequence before the next step or at a step's next poll: ``Interrupted``, the steps so far."""
        steps: list[StepResult] = []
        try:
            for stop in stops:
                self._pause(0)
                steps.append(_best_effort(stop()))
            for start in starts:
                self._pause(0)
                steps.append(start())
                if not steps[-1].ok:
                    break
        except Interrupted:
            raise Interrupted(steps) from None
        return steps

    def _pause(self, seconds: float) -> None:
        """A step's wait between polls, and the check between steps: raises ``Interrupted`` once the agent stops."""
        if self.stopping.wait(seconds):
            raise Interrupted([])

    def _cluster_steps(self, action_id: str, client: httpx.Client, verify: StepCall) -> list[StepResult]:
        """The runbook's order; stop steps are best effort, a failed start or wait ends the sequence."""
        cmd, timeout, t = self.settings.commands, self.settings.command_timeout_s, self.targets
        run = self.env.run_command
        stops: list[StepCall] = [
            partial(run_argv, "stop_vllm", cmd.vllm("stop", self.env.container), timeout, run),
            *[partial(ask_worker, w, "ray_stop", action_id, t.token, timeout, client) for w in t.workers],
            partial(run_argv, "stop_ray_head", cmd.ray("stop", "head"), timeout, run),
        ]
        ready_s = self.settings.ray_ready_timeout_s
        starts: list[StepCall] = [
            partial(run_argv, "start_ray_head", cmd.ray("start", "head"), timeout, run),
            *[partial(ask_worker, w, "ray_start", action_id, t.token, timeout, client) for w in t.workers],
            partial(wait_ray, t.ray_dashboard_url, t.ray_nodes, t.ray_gpus, ready_s, client, self._pause),
            partial(run_argv, "start_vllm", cmd.vllm("start", self.env.container), timeout, run),
            verify,
        ]
        return self._run_steps(stops, starts)

    def _mp_steps(self, action_id: str, client: httpx.Client, verify: StepCall) -> list[StepResult]:
        """vLLM's multiprocessing executor across nodes: stop the head's vLLM, stop the headless workers, start
        the workers (each waits for the head's master), start the head; stops are best effort, a failed start
        ends the sequence. No Ray step."""
        cmd, timeout, t = self.settings.commands, self.settings.command_timeout_s, self.targets
        stops: list[StepCall] = [
            partial(run_argv, "stop_vllm", cmd.vllm("stop", self.env.container), timeout, self.env.run_command),
            *[partial(ask_worker, w, "vllm_stop", action_id, t.token, timeout, client) for w in t.workers],
        ]
        starts: list[StepCall] = [
            *[partial(ask_worker, w, "vllm_start", action_id, t.token, timeout, client) for w in t.workers],
            partial(run_argv, "start_vllm", cmd.vllm("start", self.env.container), timeout, self.env.run_command),
            verify,
        ]
        return self._run_steps(stops, starts)

    async def _page(self, decision: Decision, now: float) -> None:
        detail = "no [alerts] alertmanager_url: logged only"
        outcome = "logged"
        if self.settings.mode == "observe":  # the dry run sends nothing; the page it would send is audited
            detail = 'mode = "observe": would page; not sent'
            self.audit_record(
                {"ts": now, "event": "page", "problem": decision.problem.key, "seen": decision.problem.reason,
                 "reason": decision.reason, "outcome": "not_sent", "detail": detail, "mode": "observe"}
            )  # fmt: skip
            log.info("remediation_page", problem=decision.problem.key, outcome="not_sent", detail=detail)
            return
        if self.pager is not None:
            p = decision.problem
            try:
                detail = await asyncio.to_thread(self.pager, self.node, p.key, p.action, decision.reason, now)
                outcome = "sent"
            except Exception as exc:  # Alertmanager away or refusing: audited, counted, never fatal
                detail, outcome = f"{type(exc).__name__}: {exc}"[:300], "failed"
        self.audit.append(
            {"ts": now, "event": "page", "problem": decision.problem.key, "seen": decision.problem.reason,
             "reason": decision.reason, "outcome": outcome, "detail": detail, "mode": self.settings.mode}
        )  # fmt: skip
        self.counts[("page", outcome)] += 1
        log.warning("remediation_page", problem=decision.problem.key, outcome=outcome, detail=detail)

    # -- an operator's planned restart ------------------------------------------------------------------

    async def planned_restart(self, drain: bool) -> tuple[int, dict[str, Any]]:
        """``dgxdoctor remediation restart [--drain]``: restart vLLM here now, through the guard (act mode, the
        breaker, the budget, one action at a time) and the audit; (HTTP status, the action's audit record or why it
        was refused). With ``drain``, out of rotation first, as every restart with ``[remediation] drain``."""
        now = self.clock()
        how = "drained" if drain else "cold"
        problem = Problem("operator:restart_vllm", "restart_vllm", "operator", f"an operator's planned {how} restart")
        action_id = uuid.uuid4().hex[:12]
        with self.state_file.locked():
            guard = self.load_guard()
            before = guard.state.to_doc()
            decision = guard.decide_planned(problem, now)
            if decision.verdict == "act" and self.busy.locked():
                decision = replace(decision, verdict="refuse", reason="an action is already running here")
            self._audit_decision(decision, now)
            if decision.verdict != "act":
                return 409, {"outcome": "refused", "detail": decision.reason}
            if not self.audit_record({**self._started_record(decision, action_id, now), "requested_by": "operator"}):
                return 503, {"outcome": "not_started", "detail": "the audit cannot be written: nothing runs unrecorded"}
            guard.begin(decision, action_id, now, os.getpid(), ladder=False)
            if not self.store_guard(guard, before):
                self.audit_record(self._not_started_record(decision, action_id, now))
                return 503, {"outcome": "not_started", "detail": "the state file could not be written: not run"}
        task = asyncio.get_running_loop().create_task(self._act(decision, action_id, now, drain=drain))
        self.acting = task
        record = await asyncio.shield(task)
        return 200, record

    # -- the worker's side -----------------------------------------------------------------------------

    async def run_step(self, doc: Any) -> tuple[int, dict[str, Any]]:
        """The head asks this worker to run a step; (HTTP status, answer). Only configured argv ever runs."""
        return await self.worker.run(doc)

    def reconfigure(self, new: Remediator) -> None:
        """A reload: new settings and targets; the counters, the queue and the loop stay."""
        if new.settings.mode != self.settings.mode:
            # A new mode starts afresh: act mode pages a hardware cause the dry run only recorded, and every
            # decision is audited again under its mode.
            self.gate = HardwareGate()
            self.last_decision.clear()
        self.settings = new.settings
        self.pager = new.pager
        self.node = new.node
        self.targets = new.targets
        self.audit = new.audit
        self.state_file = new.state_file
        self.env = new.env
        self.settled = None
        self.wake.set()

    def metrics(self) -> dict[str, Any]:
        return {
            "mode": "disabled" if self.disabled else self.settings.mode,
            # Observe mode's rehearsed breaker is no alert (DgxdoctorRemediationBreakerOpen): it stopped nothing
            "breaker_open": (self.breaker_open and self.settings.mode == "act") or self.disabled is not None,
            "actions": dict(self.counts),
            "state_invalid": self.state_invalid,
            "alerts_dropped": self.intake.dropped,
            "alerts_held": self.alerts_held,
            "fleet_breaker_open": self.fleet_gate.open,
            "fleet_refused": self.fleet_gate.refused,
            **self.rotation.metrics(),
        }


def _one_at_a_time(decisions: list[Decision]) -> tuple[list[Decision], Decision | None]:
    """One action per evaluation: another problem asking for one in the same breath waits its turn."""
    chosen = next((d for d in decisions if d.verdict in ("act", "page")), None)
    if chosen is None:
        return decisions, None
    why = f"{chosen.action} chosen for {chosen.problem.key}: one action at a time"
    return [d if d is chosen or d.verdict not in ("act", "page") else replace(d, verdict="refuse", reason=why)
            for d in decisions], chosen  # fmt: skip


def _would(d: Decision) -> Decision:
    """Observe mode's record of a decision act mode would carry out now: "would X" with act mode's reason."""
    return replace(d, verdict="observe", reason=f'would {d.action} (mode = "observe"): {d.reason}')


# Steps that are not commands run for the action: the waits and the verification after them.
_NOT_COMMANDS = ("verify", "wait_ray", "leave_rotation", "drain", "rejoin", INTERRUPTED)


def could_not_run(action: str, steps: list[StepResult]) -> str | None:
    """When one of the action's commands failed (a non-zero exit, a timeout, a missing program, a worker refusing
    its step): "restart_vllm could not run: exit 1: <output tail>". None when every command ran: a failed wait or
    verification is a restart that ran and did not cure. Stops are best effort and never count."""
    for step in steps:
        if step.ok or step.step.startswith("stop:") or step.step in _NOT_COMMANDS:
            continue
        where = "" if step.step == action else f"{step.step} "
        return f"{action} could not run: {where}{step.detail}"
    return None


def _best_effort(step: StepResult) -> StepResult:
    return StepResult(f"stop:{step.step}", True, ("" if step.ok else "ignored failure: ") + step.detail,
                      step.duration_s, step.argv, step.returncode)  # fmt: skip

"""The remediation loop in the daemon: findings and alerts in, the guard's decisions, the actions, the audit.

Findings come from the result store (the checks' latest results), alerts from the webhook (queued, deduplicated
per fingerprint). A loop re-evaluates every ``TICK_S`` and at once when something arrives. Decisions are audited
when they change; an action runs in a worker thread, one at a time, its start and end both written to the audit
and the guard's state before and after. A worker's agent runs its part of a cluster restart only when the head
asks (``run_step``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import httpx
import structlog

from dgxdoctor.config import RemediationSettings
from dgxdoctor.remediation.actions import StepResult, VllmTarget, ask_worker, run_argv, verify_vllm, wait_ray
from dgxdoctor.remediation.audit import AuditLog, StateFile
from dgxdoctor.remediation.guard import Decision, Guard, GuardState
from dgxdoctor.remediation.hardware_gate import HardwareGate, causes
from dgxdoctor.remediation.policy import Problem, problem_from_alert, problems_from_results
from dgxdoctor.result import CheckResult

log = structlog.get_logger(__name__)

TICK_S = 1.0
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
SEEN_FINGERPRINTS = 1000
WORKER_STEPS = ("ray_stop", "ray_start", "vllm_stop", "vllm_start")
# Steps per executor: a worker of an mp deployment runs no Ray, a worker of a Ray one no headless vLLM.
MP_WORKER_STEPS = ("vllm_stop", "vllm_start")
UPTIME_METRIC = "dgxdoctor_vllm_process_uptime_seconds"


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


# (node, problem, suggested action, reason, now) -> what happened; raises when the page could not be delivered.
Pager = Callable[[str, str, str, str, float], str]


@dataclass(frozen=True)
class Targets:
    """What the actions work on, from the vllm and ray checks' settings and the daemon's peers and token."""

    vllm: VllmTarget
    ray_dashboard_url: str
    ray_nodes: int
    ray_gpus: int
    workers: tuple[str, ...]
    token: str | None
    executor: str | None = None  # [node] executor: "mp" restarts in the mp order, else the Ray order


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
        xid_resolution: dict[int, str] | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.transport = transport  # tests inject one; None: real HTTP
        self.settings = settings
        self.pager = pager
        self.node = node
        self.targets = targets
        self.latest = latest
        self.xid_resolution = xid_resolution
        self.clock = clock
        self.audit = AuditLog(state_dir)
        self.state_file = StateFile(state_dir)
        self.counts: Counter[tuple[str, str]] = Counter()
        self.breaker_open = False
        self.finished_at: float | None = None
        self.idle = False  # True once an evaluation found no problem and nothing in flight
        self.firing: dict[str, Problem] = {}
        self.seen: OrderedDict[str, str] = OrderedDict()  # fingerprint -> startsAt already taken
        self.last_decision: dict[str, tuple[str, str]] = {}
        self.wake = asyncio.Event()
        self.busy = asyncio.Lock()
        self.task: asyncio.Task[None] | None = None
        self.gate = HardwareGate()  # no restart while a hardware cause is active (remediation/hardware_gate.py)

    # -- state -----------------------------------------------------------------------------------------

    def _load(self) -> Guard:
        return Guard(self.settings, GuardState.from_doc(self.state_file.read()))

    def _save(self, guard: Guard, before: dict[str, Any]) -> None:
        doc = guard.state.to_doc()
        if doc != before:
            self.state_file.write(doc)
        self.breaker_open = guard.state.breaker_open
        self.finished_at = guard.state.finished_at
        self.idle = not guard.state.onset and guard.state.in_flight is None

    def recover(self) -> None:
        """At start: an action that was in flight when the agent died is recorded as interrupted, not repeated."""
        if not self.state_file.path.exists():
            return  # nothing ever decided here
        with self.state_file.locked():
            guard = self._load()
            before = guard.state.to_doc()
            flight = guard.state.in_flight
            if flight is not None:
                self.audit.append(
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
        accepted = ignored = 0
        for alert in alerts:
            if alert.status == "resolved":
                self.firing.pop(alert.fingerprint, None)
                ignored += 1
                continue
            problem = problem_from_alert(alert.labels, self.node, alert.started or self.clock())
            if problem is None or self.seen.get(alert.fingerprint) == alert.starts_at:
                ignored += 1
                continue
            self.seen[alert.fingerprint] = alert.starts_at
            while len(self.seen) > SEEN_FINGERPRINTS:
                self.seen.popitem(last=False)
            self.firing[alert.fingerprint] = problem
            accepted += 1
        if accepted:
            self.wake.set()
        return accepted, ignored

    def _fresh_alert(self, problem: Problem) -> bool:
        return self.finished_at is None or problem.since is None or problem.since > self.finished_at

    def poke(self) -> None:
        self.wake.set()

    # -- the loop --------------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.recover()
        except (OSError, ValueError) as exc:  # an unwritable state_dir or a corrupt state file: say so, keep serving
            log.error("remediation_state_unreadable", error=f"{type(exc).__name__}: {exc}")
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), TICK_S)
            self.wake.clear()
            try:
                await self.evaluate()
            except Exception as exc:  # a bad state file or disk must not stop the daemon
                log.error("remediation_evaluate_failed", error=f"{type(exc).__name__}: {exc}")

    async def evaluate(self) -> None:
        now = self.clock()
        latest = self.latest()
        # An alert that began firing before the last action ended describes the world before it: stale too.
        alerts = list({p.key: p for p in self.firing.values() if self._fresh_alert(p)}.values())
        # Results of runs that started before the last action ended describe the world before it: stale.
        fresh = [r for r in latest.values() if self.finished_at is None or r.started_at > self.finished_at]
        checks = problems_from_results(fresh, self.xid_resolution)
        if not checks and not alerts and self.idle and not self.breaker_open:
            return  # nothing seen now or at the last evaluation: no state to touch
        with self.state_file.locked():
            guard = self._load()
            before = guard.state.to_doc()
            if guard.state.finished_at != self.finished_at:  # changed on disk (another process): judge again
                self.finished_at = guard.state.finished_at
                fresh = [r for r in latest.values() if self.finished_at is None or r.started_at > self.finished_at]
                checks = problems_from_results(fresh, self.xid_resolution)
            guard.observe(checks, now, "check")
            guard.observe(alerts, now, "alert")
            decisions = [guard.decide(p, now, vllm_uptime(latest)) for p in checks + alerts]
            decisions, pages = self.gate.apply(decisions, causes(latest, self.node), self.node)
            chosen = next((d for d in decisions if d.verdict in ("act", "page")), None)
            # One action per evaluation: another problem asking for one in the same breath waits its turn.
            decisions = [
                d if d is chosen or d.verdict not in ("act", "page") else replace(d, verdict="refuse",
                reason=f"{chosen.action if chosen else ''} chosen for {chosen.problem.key if chosen else ''}: one "
                "action at a time")
                for d in decisions
            ]  # fmt: skip
            action_id = uuid.uuid4().hex[:12]
            if chosen is not None and chosen.verdict == "act" and not self.busy.locked():
                guard.begin(chosen, action_id, now, os.getpid())
            elif chosen is not None and chosen.verdict == "page":
                guard.paged(chosen, now)
            self._save(guard, before)
        for decision in decisions:
            self._audit_decision(decision, now)
        if chosen is not None and chosen.verdict == "act" and not self.busy.locked():
            asyncio.get_running_loop().create_task(self._act(chosen, action_id, now))
        elif chosen is not None and chosen.verdict == "page":
            await self._page(chosen, now)
        for page in pages:
            await self._page(page, now)

    def _audit_decision(self, d: Decision, now: float) -> None:
        shown = (d.verdict, _NUMBER.sub("#", d.reason))  # "held 3 s" and "held 4 s" are the same decision
        key = d.problem.key
        if self.last_decision.get(key) == shown and d.verdict not in ("act", "page"):
            return
        self.last_decision[key] = shown
        self.audit.append(
            {"ts": now, "event": "decision", "problem": key, "source": d.problem.source, "seen": d.problem.reason,
             "rule": d.problem.action, "action": d.action, "verdict": d.verdict, "reason": d.reason,
             "mode": self.settings.mode}
        )  # fmt: skip
        log.info("remediation_decision", problem=key, action=d.action, verdict=d.verdict, reason=d.reason)

    # -- acting ----------------------------------------------------------------------------------------

    async def _act(self, decision: Decision, action_id: str, started: float) -> None:
        async with self.busy:
            self.audit.append(
                {"ts": started, "event": "action_started", "id": action_id, "action": decision.action,
                 "problem": decision.problem.key, "mode": "act", "pid": os.getpid()}
            )  # fmt: skip
            steps = await asyncio.to_thread(self._execute, decision.action, action_id)
            ok = all(s.ok for s in steps if not s.step.startswith("stop")) and bool(steps)
            outcome = "success" if ok else "failed"
            verification = next((s.to_doc() for s in steps if s.step == "verify"), None)
            end = self.clock()
            self.audit.append(
                {"ts": end, "event": "action", "id": action_id, "action": decision.action,
                 "problem": decision.problem.key, "seen": decision.problem.reason, "mode": "act",
                 "steps": [s.to_doc() for s in steps], "verification": verification, "outcome": outcome,
                 "duration_s": round(end - started, 3)}
            )  # fmt: skip
            self.counts[(decision.action, outcome)] += 1
            for fingerprint, problem in list(self.firing.items()):
                if problem.key == decision.problem.key or problem.action == decision.problem.action:
                    del self.firing[fingerprint]
            with self.state_file.locked():
                guard = self._load()
                before = guard.state.to_doc()
                guard.finish(end)
                self._save(guard, before)
            log.info("remediation_action", action=decision.action, outcome=outcome, duration_s=round(end - started, 3))
        self.wake.set()

    def _execute(self, action: str, action_id: str) -> list[StepResult]:
        cmd, timeout = self.settings.commands, self.settings.command_timeout_s
        with httpx.Client(transport=self.transport) as client:
            if self.targets.executor == "mp":
                # Either restart is the whole mp deployment: a head restarted alone leaves the headless workers
                # in a process group that no longer exists (docs/remediation.md).
                steps = self._mp_steps(action_id, client)
            elif action == "restart_vllm":
                steps = [run_argv("restart_vllm", cmd.restart_vllm, timeout)]
            else:
                steps = self._cluster_steps(action_id, client)
            if steps and steps[-1].ok:
                steps.append(verify_vllm(self.targets.vllm, self.settings.verify_timeout_s, client))
        return steps

    def _cluster_steps(self, action_id: str, client: httpx.Client) -> list[StepResult]:
        """The runbook's order; stop steps are best effort, a failed start or wait ends the sequence."""
        cmd, timeout, t = self.settings.commands, self.settings.command_timeout_s, self.targets
        steps = [run_argv("stop_vllm", cmd.stop_vllm, timeout)]
        steps += [ask_worker(w, "ray_stop", action_id, t.token, timeout, client) for w in t.workers]
        steps.append(run_argv("stop_ray_head", cmd.ray("stop", "head"), timeout))
        ready_s = self.settings.ray_ready_timeout_s
        starts: list[Callable[[], StepResult]] = [
            partial(run_argv, "start_ray_head", cmd.ray("start", "head"), timeout),
            *[partial(ask_worker, w, "ray_start", action_id, t.token, timeout, client) for w in t.workers],
            partial(wait_ray, t.ray_dashboard_url, t.ray_nodes, t.ray_gpus, ready_s, client),
            partial(run_argv, "start_vllm", cmd.start_vllm, timeout),
        ]
        for step in starts:
            steps.append(step())
            if not steps[-1].ok:
                break
        return [s if not s.step.startswith(("stop_", "ray_stop")) else _best_effort(s) for s in steps]

    def _mp_steps(self, action_id: str, client: httpx.Client) -> list[StepResult]:
        """vLLM's multiprocessing executor across nodes: stop the head's vLLM, stop the headless workers, start
        the workers (each waits for the head's master), start the head; stops are best effort, a failed start
        ends the sequence. No Ray step."""
        cmd, timeout, t = self.settings.commands, self.settings.command_timeout_s, self.targets
        steps = [run_argv("stop_vllm", cmd.stop_vllm, timeout)]
        steps += [ask_worker(w, "vllm_stop", action_id, t.token, timeout, client) for w in t.workers]
        starts: list[Callable[[], StepResult]] = [
            *[partial(ask_worker, w, "vllm_start", action_id, t.token, timeout, client) for w in t.workers],
            partial(run_argv, "start_vllm", cmd.start_vllm, timeout),
        ]
        for step in starts:
            steps.append(step())
            if not steps[-1].ok:
                break
        return [s if not s.step.startswith(("stop_", "vllm_stop")) else _best_effort(s) for s in steps]

    async def _page(self, decision: Decision, now: float) -> None:
        detail = "no [alerts] alertmanager_url: logged only"
        outcome = "logged"
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

    # -- the worker's side -----------------------------------------------------------------------------

    async def run_step(self, step: str, action_id: str) -> tuple[int, dict[str, Any]]:
        """The head asks this worker to run ``step``; (HTTP status, answer). Only configured argv ever runs."""
        s = self.settings
        if step not in WORKER_STEPS:
            return 400, {"ok": False, "detail": f"unknown step {step[:40]!r}; known: {', '.join(WORKER_STEPS)}"}
        if s.mode != "act" or s.role != "worker":
            return 409, {"ok": False, "detail": f"this agent is mode={s.mode}, role={s.role}: it runs no steps"}
        mp = self.targets.executor == "mp"
        if (step in MP_WORKER_STEPS) != mp:
            return 409, {"ok": False, "detail": f"step {step} does not belong to this node's executor "
                         f"({self.targets.executor or 'ray'}, [node] executor)"}  # fmt: skip
        if self.busy.locked():
            return 409, {"ok": False, "detail": "an action is already running here"}
        async with self.busy:
            argv = s.commands.worker_argv(step)
            result = await asyncio.to_thread(run_argv, step, argv, s.command_timeout_s)
        outcome = "success" if result.ok else "failed"
        self.audit.append(
            {"ts": self.clock(), "event": "step", "id": action_id[:64], "requested_by": "head", "mode": "act",
             **result.to_doc(), "outcome": outcome}
        )  # fmt: skip
        self.counts[(step, outcome)] += 1
        return 200, {"ok": result.ok, "detail": result.detail, "duration_s": round(result.duration_s, 3)}

    def reconfigure(self, new: Remediator) -> None:
        """A reload: new settings and targets; the counters, the queue and the loop stay."""
        self.settings = new.settings
        self.pager = new.pager
        self.node = new.node
        self.targets = new.targets
        self.audit = new.audit
        self.state_file = new.state_file
        self.wake.set()

    def metrics(self) -> dict[str, Any]:
        return {"mode": self.settings.mode, "breaker_open": self.breaker_open, "actions": dict(self.counts)}


def _best_effort(step: StepResult) -> StepResult:
    return StepResult(f"stop:{step.step}", True, ("" if step.ok else "ignored failure: ") + step.detail,
                      step.duration_s, step.argv, step.returncode)  # fmt: skip

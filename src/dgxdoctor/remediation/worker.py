"""A worker's side of a cluster restart: the head asks over ``POST /remediation/step``, this node decides.

The request names only the step (``ray_stop``/``ray_start``, or ``vllm_stop``/``vllm_start`` of an mp deployment's
headless vLLM), the head's action id, the time it was sent and an
HMAC-SHA256 of the three under the peer token (``actions.step_mac``): only this node's configured argv runs.
The worker applies its own guard too: act mode and role, its breaker, its budget (a cluster restart's first step
spends one action), one step at a time, and replay protection: a request outside ``STEP_WINDOW_S`` of this
node's clock is refused, and each (action, step) runs once (remembered in the state file, bounded).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from dgxdoctor.environment import Environment
from dgxdoctor.remediation.actions import STEP_WINDOW_S, StepRequest, run_argv
from dgxdoctor.remediation.guard import Guard
from dgxdoctor.settings.remediation import RemediationSettings
from dgxdoctor.sources.statefile import StateFile
from dgxdoctor.validation import validate

# Steps per executor: a worker of an mp deployment runs no Ray, a worker of a Ray one no headless vLLM.
MP_WORKER_STEPS = ("vllm_stop", "vllm_start")


class StepTargets(Protocol):
    """What of the action targets a step reads (``engine.Targets``)."""

    @property
    def token(self) -> str | None: ...
    @property
    def executor(self) -> str | None: ...


class StepHost(Protocol):
    """What a step needs of the node's remediation (``engine.Remediator``): its settings and targets, the lock
    that keeps one action at a time, the guard's state under its lock, the audit and the outcome counters."""

    settings: RemediationSettings
    env: Environment
    busy: asyncio.Lock
    counts: Counter[tuple[str, str]]
    clock: Callable[[], float]
    state_file: StateFile

    @property
    def targets(self) -> StepTargets: ...
    def load_guard(self) -> Guard: ...
    def store_guard(self, guard: Guard, before: dict[str, Any]) -> bool: ...
    def audit_record(self, record: dict[str, Any]) -> bool: ...


class WorkerSteps:
    def __init__(self, owner: StepHost) -> None:
        self.owner = owner

    async def run(self, doc: Any) -> tuple[int, dict[str, Any]]:
        """(HTTP status, answer) for one step request."""
        r, s = self.owner, self.owner.settings
        try:
            request = validate(StepRequest, doc)
        except msgspec.ValidationError as exc:
            return 400, {"ok": False, "detail": str(exc)[:300]}
        if s.mode != "act" or s.role != "worker":
            return 409, {"ok": False, "detail": f"this agent is mode={s.mode}, role={s.role}: it runs no steps"}
        if r.targets.token is None or not request.signed_by(r.targets.token):
            return 401, {"ok": False, "detail": "the request's mac does not match this node's token"}
        if (request.step in MP_WORKER_STEPS) != (r.targets.executor == "mp"):
            return 409, {"ok": False, "detail": f"step {request.step} does not belong to this node's executor "
                         f"({r.targets.executor or 'ray'}, [node] executor)"}  # fmt: skip
        if r.busy.locked():
            return 409, {"ok": False, "detail": "an action is already running here"}
        async with r.busy:
            refused = await asyncio.to_thread(self._admit, request)
            if refused is None and not r.audit_record(
                {**self._record(request, "started", ""), "event": "step_started"}
            ):
                refused = "the audit cannot be written: nothing runs unrecorded"
            if refused is not None:
                r.audit_record(self._record(request, "refused", refused))
                r.counts[(request.step, "refused")] += 1
                return 409, {"ok": False, "detail": refused}
            argv = s.commands.worker_argv(request.step, r.env.container)
            result = await asyncio.to_thread(run_argv, request.step, argv, s.command_timeout_s, r.env.run_command)
        outcome = "success" if result.ok else "failed"
        r.audit_record({**self._record(request, outcome, result.detail), **result.to_doc(), "outcome": outcome})
        r.counts[(request.step, outcome)] += 1
        return 200, {"ok": result.ok, "detail": result.detail, "duration_s": round(result.duration_s, 3)}

    def _admit(self, request: StepRequest) -> str | None:
        """The worker's own guard, under the state lock; the admission is saved before anything runs."""
        r = self.owner
        now = r.clock()
        try:
            with r.state_file.locked():
                guard = r.load_guard()
                before = guard.state.to_doc()
                refused = guard.admit_step(request.id, request.step, request.ts, now, STEP_WINDOW_S)
                if not r.store_guard(guard, before):
                    return "the state file cannot be written: nothing runs unrecorded"
        except OSError as exc:
            return f"the state cannot be read: {type(exc).__name__}"
        return refused

    def _record(self, request: StepRequest, outcome: str, detail: str) -> dict[str, Any]:
        return {"ts": self.owner.clock(), "event": "step", "id": request.id, "step": request.step,
                "requested_by": "head", "sent_at": request.ts, "mode": "act", "outcome": outcome,
                "detail": detail}  # fmt: skip

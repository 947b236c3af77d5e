"""``dgxdoctor remediation status`` and ``reset``: read (and reset) the guard's state in the state directory.

They work whether the daemon runs or not: the state file is the one truth, read and written under its lock.
"""

from __future__ import annotations

import time
from typing import Any

from dgxdoctor.config import Config
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.guard import Guard, GuardState
from dgxdoctor.remediation.policy import OLD_EVIDENCE, printable

# Decisions that ran nothing: observe mode's "would X" (where act mode runs X), a refusal (breaker, hardware cause,
# role), a suggestion, and a firing alert held on old evidence (an operator sees it firing and nothing done; the
# other holds, hold_s and cooldowns, pass by themselves).
HELD_VERDICTS = ("observe", "refuse", "suggest")


def not_acted_on(record: dict[str, Any]) -> bool:
    verdict = record.get("verdict")
    return verdict in HELD_VERDICTS or (verdict == "hold" and record.get("reason") == OLD_EVIDENCE)


REHEARSAL = "rehearsal: observe mode spent this budget, ladder and any breaker on actions it did not run; act mode \
forgets them"


def status_document(config: Config, last: int = 10, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    s = config.remediation
    state_file = guard_state_file(config.paths.state_dir)
    with state_file.locked():
        try:
            guard = Guard(s, GuardState.from_doc(state_file.read()))
        except ValueError as exc:
            raise ValueError(f"{exc}; `dgxdoctor remediation reset` sets it aside and starts afresh") from None
    st = guard.state
    records = AuditLog(config.paths.state_dir).tail(5000)
    actions = [r for r in records if r.get("event") in ("action", "page", "step")][-last:]
    # What it decided and did not do: in observe mode the "would restart" decisions are all there is to see.
    decisions = [r for r in records if r.get("event") == "decision" and not_acted_on(r)][-last:]
    return {
        "node": config.node,
        "mode": s.mode,
        "role": s.role,  # [node] role, whether or not a [remediation] table exists (config._one_role)
        "breaker": {"open": st.breaker_open, "reason": st.breaker_reason, "opened_at": st.breaker_opened_at},
        "budget": {"limit": s.budget, "window_s": s.budget_window_s, "left": max(s.budget - guard.budget_used(now), 0)},
        "in_flight": st.in_flight.to_doc() if st.in_flight else None,
        "dry_run": st.dry_run,
        "last_actions": [
            {
                k: r.get(k)
                for k in ("ts", "event", "id", "action", "step", "problem", "outcome", "duration_s", "detail", "bundle")
            }
            for r in actions
        ],
        "last_decisions": [
            {k: r.get(k) for k in ("ts", "problem", "action", "verdict", "reason", "mode")} for r in decisions
        ],
        "audit": str(AuditLog(config.paths.state_dir).path),
    }


def render_status(doc: dict[str, Any]) -> str:
    breaker = doc["breaker"]
    budget = doc["budget"]
    lines = [
        f"node {doc['node']}: mode {doc['mode']}, role {doc['role'] or '-'}",
        f"breaker: {'OPEN (' + str(breaker['reason']) + ')' if breaker['open'] else 'closed'}",
        f"budget: {budget['left']} of {budget['limit']} actions left in {budget['window_s']:g} s",
        *([REHEARSAL] if doc.get("dry_run") else []),
        f"in flight: {doc['in_flight']['action'] if doc['in_flight'] else 'nothing'}",
        "last actions:" if doc["last_actions"] else "last actions: none",
    ]
    for r in doc["last_actions"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r.get("ts") or 0)))
        what = r.get("action") or r.get("step") or r.get("event")
        took = f" in {r['duration_s']:g} s" if isinstance(r.get("duration_s"), int | float) else ""
        lines.append(f"  {when} {what} {r.get('outcome')}{took} ({r.get('problem') or r.get('id') or ''})")
        if r.get("bundle"):
            lines.append(f"    evidence: {r['bundle']}")
    lines += _decision_lines(doc.get("last_decisions", []))
    lines.append(f"audit: {doc['audit']}")
    return "\n".join(printable(line) for line in lines)  # names from the network never drive the terminal


def _decision_lines(decisions: list[dict[str, Any]]) -> list[str]:
    """``observe``: would restart_vllm; ``refuse``/``suggest``/``hold``: why not; newest last."""
    lines = ["decisions not acted on:" if decisions else "decisions not acted on: none"]
    for r in decisions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r.get("ts") or 0)))
        lines.append(f"  {when} {r.get('verdict')} {r.get('action')} for {r.get('problem')}: {r.get('reason')}")
    return lines


def reset(config: Config, now: float | None = None) -> None:
    """Close the breaker. An invalid state file (the one thing that may stop a reset) is set aside first."""
    now = time.time() if now is None else now
    state_file = guard_state_file(config.paths.state_dir)
    kept = None
    with state_file.locked():
        try:
            guard = Guard(config.remediation, GuardState.from_doc(state_file.read()))
        except ValueError:
            kept = state_file.set_aside(now)
            guard = Guard(config.remediation)
        was_open = guard.state.breaker_open or kept is not None
        guard.reset()
        state_file.write(guard.state.to_doc())
    AuditLog(config.paths.state_dir).append(
        {"ts": now, "event": "reset", "by": "dgxdoctor remediation reset", "breaker_was_open": was_open,
         "invalid_state_kept_as": str(kept) if kept else None}
    )  # fmt: skip

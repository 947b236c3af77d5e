"""Which findings and alerts lead to which action: pure functions, no clock, no I/O.

Three outcomes. ``restart_vllm`` for a serving process that is dead, hung or stalled; ``restart_cluster`` for a
Ray cluster that lost a node or GPUs, or NCCL/Gloo failing between the nodes; ``page`` for what no restart
cures (XIDs asking for a GPU reset or a reboot, IB links down, hardware and version drift): suggested to a
human, never acted on. Which finding asks for which is decided in judge/ (judge.consequence) and carried on the
finding (``Finding.action``); an alert carries it in its ``dgxdoctor_action`` label, which the generated rules take
from the same table. The ladder: when ``restart_vllm`` did not cure a problem, its next occurrence gets
``restart_cluster``; when that did not either, the answer is ``page``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from msgspec import Struct

from dgxdoctor.judge.consequence import TABLE
from dgxdoctor.result import CheckResult, Status

ActionName = Literal["restart_vllm", "restart_cluster", "page"]
RESTARTS: tuple[ActionName, ...] = ("restart_vllm", "restart_cluster")
LADDER: tuple[ActionName, ...] = ("restart_vllm", "restart_cluster", "page")


class Problem(Struct, frozen=True):
    """A condition remediation may answer. ``key`` identifies it across runs (same key, same problem)."""

    key: str
    action: ActionName
    source: Literal["check", "alert", "operator"]
    reason: str
    since: float | None = None  # when the condition began, if the source says (an alert's startsAt)
    code: str | None = None  # the finding that asks for it (None: an alert)
    # An alert's ``code`` label: the finding its rule reads (judge.consequence names the check that reports it).
    alert_code: str | None = None


def problems_from_results(results: Iterable[CheckResult], after: float | None = None) -> list[Problem]:
    """One problem per (check, action): the critical findings of the latest results whose action is not "none".

    ``after``: when the last action ended. A finding whose evidence was seen before then (``Finding.seen_at``: a
    log line the logs check still holds, a peer's result from before the restart) describes the world before the
    action, even in a run that started after it: it is no problem, and no sign that the action did not cure."""
    found: dict[str, Problem] = {}
    for result in results:
        for finding in result.findings:
            action = finding.action
            if finding.status is not Status.CRITICAL or action == "none":
                continue
            if after is not None and finding.seen_at is not None and finding.seen_at <= after:
                continue
            key = f"check:{result.check}:{action}"
            if key not in found:
                subject = f" {finding.subject}" if finding.subject else ""
                reason = f"{finding.code}{subject}: {finding.message}"
                found[key] = Problem(key, action, "check", reason, code=finding.code)
    return list(found.values())


def problem_from_alert(labels: Mapping[str, str], node: str, since: float | None) -> Problem | None:
    """A firing alert for ``node`` that carries ``dgxdoctor_action``; None when it is not ours to act on."""
    action = labels.get("dgxdoctor_action")
    if labels.get("node") != node or action not in RESTARTS:
        return None
    name = printable(labels.get("alertname", "alert"))[:MAX_ALERT_NAME]
    code = printable(labels["code"])[:MAX_ALERT_NAME] if labels.get("code") else None
    return Problem(f"alert:{name}:{action}", action, "alert", f"alert {name} firing", since,  # type: ignore[arg-type]
                   alert_code=code)  # fmt: skip


# Why a firing alert that is not fresh (below) is held: written to the audit once per episode, so an operator who
# sees the alert firing and nothing done reads why.
OLD_EVIDENCE = (
    "its evidence is from before the last action ended: it started before it, or this node's own check has not "
    "seen its code since"
)


def fresh_alert(problem: Problem, results: Mapping[str, CheckResult], after: float | None) -> bool:
    """Whether a firing alert's evidence is from after the last action ended (``after``): only then is it a reason.

    An alert's ``startsAt`` is when Prometheus first found its expression true, not when the evidence was seen: a
    rule over a counter's ``increase(...[5m])`` describes a log line for five minutes after it, and a Prometheus
    that evaluates late (load, its interval, Alertmanager's ``group_wait``) starts firing after the restart that
    cured it. So where this node reports the alert's code itself (``judge.consequence``: the check that reports it
    has a result here), the alert is corroborated by that check: its latest run, started after the action, must
    hold a finding of the code whose evidence (``Finding.seen_at``, else the run) is from after it. An alert this
    node cannot check (no code, or a check that does not run here: a peer's or the fleet's view) has its
    ``startsAt`` alone, which must be after the action ended. Before any action, every firing alert is fresh."""
    if after is None:
        return True
    if problem.since is not None and problem.since <= after:
        return False
    code = problem.alert_code
    own = results.get(TABLE[code].check) if code is not None and code in TABLE else None
    if own is None:
        return True
    if own.started_at <= after:
        return False  # the check has not looked again since the action
    return any(f.code == code and (f.seen_at if f.seen_at is not None else own.started_at) > after
               for f in own.findings)  # fmt: skip


MAX_ALERT_NAME = 128


def printable(text: str) -> str:
    """``text`` with what a terminal would interpret (escapes, control characters, lone surrogates) shown as
    ``\\xNN``/``\\uNNNN``: names from the network reach the state file, the audit and an operator's terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(ord(c)) for c in text)


def _escape(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class Attempt(Struct, frozen=True):
    """An earlier action against the same problem, as the guard remembers it."""

    action: ActionName
    at: float


def escalate(action: ActionName, attempts: Sequence[Attempt], now: float, ladder_window_s: float) -> ActionName:
    """Climb the ladder: the step after the highest step already tried within ``ladder_window_s``.

    A problem that comes back after a restart was not cured by it; ``page`` is where the ladder stops.
    """
    if action == "page":
        return "page"
    recent = [a.action for a in attempts if now - a.at <= ladder_window_s]
    step = LADDER.index(action)
    for tried in recent:
        if tried in LADDER:
            step = max(step, LADDER.index(tried) + 1)
    return LADDER[min(step, len(LADDER) - 1)]

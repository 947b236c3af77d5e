"""``dgxdoctor conditions``: this node's conditions in node-problem-detector's format (docs/fleet.md, "Kubernetes"),
from the local daemon's latest results; ``judge.conditions`` decides them.

Kubernetes keeps ``lastTransitionTime``, the moment a condition last changed status; a command run now and then
knows it only by remembering what it said before, in ``conditions.json`` in the state directory (written when a
status changes). A state directory it cannot read or write costs only that: the time is then this run's.
"""

from __future__ import annotations

import time
from typing import Any

from dgxdoctor.commands.local_daemon import DaemonUnavailable, local_state
from dgxdoctor.config import Config
from dgxdoctor.judge.conditions import NodeCondition, node_conditions
from dgxdoctor.sources.statefile import StateFile

STATE_NAME = "conditions.json"
SOURCE = "dgxdoctor"  # the condition's source, as node-problem-detector names its monitors
EX_OK, EX_CRITICAL, EX_UNKNOWN = 0, 2, 3  # as `dgxdoctor check` (Nagios)


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def transitions(state: StateFile, found: list[NodeCondition], now: float) -> dict[str, float]:
    """When each condition took its present status: remembered from the last run while it holds, now where it
    changed (or was never seen). The memory is updated when anything changed."""
    before = state.load().get("conditions", {})
    since: dict[str, float] = {}
    memory: dict[str, dict[str, Any]] = {}
    for c in found:
        old = before.get(c.type) if isinstance(before, dict) else None
        kept = isinstance(old, dict) and old.get("status") == c.status and isinstance(old.get("since"), int | float)
        since[c.type] = float(old["since"]) if kept and isinstance(old, dict) else now
        memory[c.type] = {"status": c.status, "since": since[c.type]}
    if memory != before:
        state.save({"conditions": memory})
    return since


def conditions_document(config: Config, now: float | None = None) -> dict[str, Any]:
    """The node's conditions, with Kubernetes' field names."""
    now = time.time() if now is None else now
    try:
        doc = local_state(config)
        found, node = node_conditions(doc), doc.node
    except DaemonUnavailable as exc:
        found, node = node_conditions(None, str(exc)), config.node
    since = transitions(StateFile(config.paths.state_dir / STATE_NAME), found, now)
    return {
        "node": node,
        "source": SOURCE,
        "generated_at": rfc3339(now),
        "conditions": [_condition(c, now, since[c.type]) for c in found],
    }


def _condition(c: NodeCondition, now: float, since: float) -> dict[str, str]:
    return {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
            "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(since)}  # fmt: skip


def exit_status(doc: dict[str, Any]) -> int:
    statuses = {c["status"] for c in doc["conditions"]}
    return EX_CRITICAL if "True" in statuses else EX_UNKNOWN if "Unknown" in statuses else EX_OK


# node-problem-detector's custom plugin protocol (pkg/custompluginmonitor/types): OK, NonOK, Unknown.
PLUGIN_EXIT = {"False": 0, "True": 1, "Unknown": 2}


def plugin_answer(config: Config, condition: str) -> tuple[str, int]:
    """One condition for a node-problem-detector custom plugin rule: (its reason and message, the exit status).
    ValueError for a type that is none of ours."""
    from dgxdoctor.judge.conditions import CONDITIONS, OTHER

    types = [r.type for r in (*CONDITIONS, OTHER)]
    if condition not in types:
        raise ValueError(f"no condition {condition!r}; known: {', '.join(types)}")
    doc = conditions_document(config)
    found = next(c for c in doc["conditions"] if c["type"] == condition)
    return f"{found['reason']}: {found['message']}", PLUGIN_EXIT[found["status"]]


def conditions_table(doc: dict[str, Any]) -> str:
    rows = [(c["type"], c["status"], c["reason"], c["message"]) for c in doc["conditions"]]
    width = max(len(r[0]) for r in rows)
    lines = [f"{doc['node']}: node conditions ({doc['generated_at']})"]
    lines += [f"  {t:<{width}}  {s:<7}  {r}: {m}" for t, s, r, m in rows]
    return "\n".join(lines)

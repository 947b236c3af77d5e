"""What ``dgxdoctor slurm-health`` does to this node's Slurm record, decided from the daemon's latest results (pure).

A CRITICAL finding drains the node with a reason drain monitors can match on, ``dgxdoctor:<CODE>:<subject>``; a
node dgxdoctor drained is resumed once no CRITICAL is left and no check's outcome is unknown (a check that cannot
say is no evidence the fault cleared). A node drained by anyone else (its reason does not start with
``dgxdoctor:``) is never touched: an operator's drain is the operator's to lift.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from dgxdoctor.documents import ResultsDocument
from dgxdoctor.judge.conditions import about_this_node
from dgxdoctor.lazy_re import LazyPattern, lazy_compile
from dgxdoctor.sources.slurm import SlurmNode

REASON_PREFIX = "dgxdoctor:"
# What a reason's code and subject keep: Slurm stores the reason as given, and monitors split it on ':'. Anything
# else (spaces, quotes, newlines, '[' that Slurm's own "[user@time]" suffix uses) becomes '_'. The code keeps no
# ':' so the split stays three parts; a subject may (a PCI address, 0000:3b:00.0).
UNSAFE_CODE = lazy_compile(r"[^A-Za-z0-9_.-]")
UNSAFE_SUBJECT = lazy_compile(r"[^A-Za-z0-9_.:/@+-]")
MAX_CODE = 48
MAX_SUBJECT = 96
NO_SUBJECT = "node"  # a finding about the node as a whole

Verb = Literal["drain", "resume", "none"]


class Critical(Struct, frozen=True):
    check: str
    code: str
    subject: str | None
    hardware: bool  # judge/ marked it a hardware or driver fault (cure "hardware"): named first


class SlurmPlan(Struct, frozen=True):
    verb: Verb
    why: str
    reason: str | None = None  # the drain's reason


def sanitised(text: str, unsafe: LazyPattern, limit: int) -> str:
    return unsafe.sub("_", text)[:limit] or "_"


def drain_reason(code: str, subject: str | None) -> str:
    """``dgxdoctor:<CODE>:<subject>``, both parts cleaned of what a reason or a monitor's split would misread."""
    return (
        f"{REASON_PREFIX}{sanitised(code, UNSAFE_CODE, MAX_CODE)}:"
        f"{sanitised(subject or NO_SUBJECT, UNSAFE_SUBJECT, MAX_SUBJECT)}"
    )


def criticals(doc: ResultsDocument) -> list[Critical]:
    """Every CRITICAL finding about this node, hardware faults first, then in the checks' order; a check CRITICAL
    without a critical finding counts as ``<CHECK>_CRITICAL`` about the node. The peer comparison's count only
    where they name this node: a peer's fault drains the peer (its own slurm-health), not this node."""
    found: list[Critical] = []
    for check in doc.checks:
        critical = [f for f in check.findings if f.status == "critical"]
        own = [
            Critical(check.name, f.code, f.subject, f.cure == "hardware")
            for f in critical
            if about_this_node(check.name, f.subject, doc.node)
        ]
        if not critical and check.status == "critical":
            own = [Critical(check.name, f"{check.name.upper()}_CRITICAL", None, False)]
        found += own
    return sorted(found, key=lambda c: not c.hardware)  # stable: the checks' order within each kind


def unknown_checks(doc: ResultsDocument) -> list[str]:
    return [c.name for c in doc.checks if c.status == "unknown"]


def ours(node: SlurmNode) -> bool:
    """The node's drain is dgxdoctor's own (its reason says so)."""
    return node.drained and (node.reason or "").startswith(REASON_PREFIX)


def plan(doc: ResultsDocument, node: SlurmNode) -> SlurmPlan:
    """What to do with ``node``'s record given the daemon's latest results ``doc``."""
    found = criticals(doc)
    if found:
        first = found[0]
        reason = drain_reason(first.code, first.subject)
        more = f" (and {len(found) - 1} more critical finding(s))" if len(found) > 1 else ""
        if node.drained and not ours(node):
            return SlurmPlan("none", f"{first.code} is critical{more}, but {node.name} is already drained by "
                             f"someone else ({node.reason or 'no reason'}): left as it is")  # fmt: skip
        if ours(node) and node.reason == reason:
            return SlurmPlan("none", f"{node.name} stays drained: {reason}{more}")
        return SlurmPlan("drain", f"{first.check}: {first.code} is critical{more}", reason)
    if not ours(node):
        state = "drained by someone else: left as it is" if node.drained else "not drained"
        return SlurmPlan("none", f"no critical finding; {node.name} is {state}")
    unknown = unknown_checks(doc)
    if unknown:
        return SlurmPlan("none", f"no critical finding, but {', '.join(unknown)} cannot say (unknown): {node.name} "
                         f"stays drained ({node.reason})")  # fmt: skip
    return SlurmPlan("resume", f"{node.reason} cleared: no critical finding, every check answered")

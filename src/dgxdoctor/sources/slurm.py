"""Slurm's record of this node, read and changed with ``scontrol`` (argv only, never a shell).

By hand: ``scontrol show node dgx-a`` (the record), ``scontrol update nodename=dgx-a state=drain
reason="dgxdoctor:XID_79:0000:3b:00.0"`` and ``scontrol update nodename=dgx-a state=resume``. ``SLURM_CONF`` in
the environment names another slurm.conf, as for every Slurm command.
"""

from __future__ import annotations

import re

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.commands import CommandRunner

SCONTROL = "scontrol"

# `scontrol show node` (Slurm 22.05, slurm.conf(5) and scontrol(1)); one field group per line:
#    NodeName=dgxd-node1 Arch=x86_64 CoresPerSocket=1
NODE_NAME = lazy_compile(r"^NodeName=(?P<name>\S+)", re.MULTILINE)
#    State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
STATE = lazy_compile(r"(?:^|\s)State=(?P<state>\S+)", re.MULTILINE)
#    Reason=dgxdoctor:XID_79:GPU-abc [root@2026-12-05T11:42:07]
# Slurm shows who set the reason and when after it, in brackets; the reason itself may hold spaces.
REASON = lazy_compile(
    r"^[ \t]*Reason=(?P<reason>.*?)(?:[ \t]+\[(?P<who>[^\]@\s]*)@(?P<when>[^\]\s]*)\])?[ \t]*$", re.MULTILINE
)


class SlurmNode(Struct, frozen=True):
    """One node's record: its state flags (``IDLE+DRAIN``) and reason, as ``scontrol show node`` prints them."""

    name: str
    state: str
    reason: str | None = None
    reason_by: str | None = None  # who set the reason (``root``), when Slurm says

    @property
    def flags(self) -> frozenset[str]:
        """The state's parts: ``IDLE+DRAIN`` -> {IDLE, DRAIN}; a draining node is ``MIXED+DRAIN`` (or DRAINING)."""
        return frozenset(part for part in self.state.upper().split("+") if part)

    @property
    def drained(self) -> bool:
        """Drained or draining: Slurm starts no new job there."""
        return any(flag.startswith("DRAIN") for flag in self.flags)


class ScontrolError(Exception):
    """``scontrol`` failed (not installed, no controller, an unknown node): its own words."""


def parse_show_node(text: str) -> SlurmNode:
    """``scontrol show node NAME``'s text -> the record; ValueError when it holds no node."""
    name = NODE_NAME.search(text)
    state = STATE.search(text)
    if name is None or state is None:
        raise ValueError("no NodeName= and State= in scontrol's output")
    reason = REASON.search(text)
    given = reason["reason"].strip() if reason is not None else ""
    return SlurmNode(
        name=name["name"],
        state=state["state"],
        reason=given if given and given != "(null)" else None,
        reason_by=reason["who"] if reason is not None and reason["who"] else None,
    )


def show_node(run: CommandRunner, name: str, timeout_s: float) -> SlurmNode:
    """This node's record; ScontrolError with scontrol's message when it cannot be read."""
    done = _run(run, [SCONTROL, "show", "node", name], timeout_s)
    try:
        return parse_show_node(done)
    except ValueError as exc:
        raise ScontrolError(f"scontrol show node {name}: {exc}") from None


def drain_argv(name: str, reason: str) -> list[str]:
    return [SCONTROL, "update", f"nodename={name}", "state=drain", f"reason={reason}"]


def resume_argv(name: str) -> list[str]:
    return [SCONTROL, "update", f"nodename={name}", "state=resume"]


def update(run: CommandRunner, argv: list[str], timeout_s: float) -> None:
    """Run one ``scontrol update``; ScontrolError when it fails."""
    _run(run, argv, timeout_s)


def _run(run: CommandRunner, argv: list[str], timeout_s: float) -> str:
    from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout

    try:
        done = run(argv, timeout_s)
    except (CommandNotFound, CommandTimeout, OSError) as exc:
        raise ScontrolError(f"{' '.join(argv[:3])}: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise ScontrolError(f"{' '.join(argv[:3])}: {said[:300]}")
    return done.stdout

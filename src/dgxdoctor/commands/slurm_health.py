"""``dgxdoctor slurm-health``: Slurm's ``HealthCheckProgram`` (docs/fleet.md, "Slurm").

slurmd runs it every ``HealthCheckInterval`` and kills it after 60 s. It runs no probe: it reads the local daemon's
latest results (``commands.local_daemon``, a few milliseconds), reads this node's record with ``scontrol show
node``, and drains or resumes it as ``remediation.slurm_drain`` decides. Every step has its own short timeout, so
the whole run ends within ``WORST_CASE_S`` whatever hangs.

When the daemon does not answer, nothing is changed and the exit status says so (``EX_UNAVAILABLE``): not knowing
is not a fault, and draining on it would take every node out of service the moment the agent is restarted.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from dgxdoctor.commands.local_daemon import DaemonUnavailable, local_state
from dgxdoctor.config import Config
from dgxdoctor.remediation.slurm_drain import plan
from dgxdoctor.sources.commands import CommandRunner
from dgxdoctor.sources.slurm import ScontrolError, drain_argv, resume_argv, show_node, update

STATE_TIMEOUT_S = 5.0
SCONTROL_TIMEOUT_S = 15.0
# The local daemon, one show and one update: within slurmd's 60 s kill.
WORST_CASE_S = STATE_TIMEOUT_S + 2 * SCONTROL_TIMEOUT_S
EX_OK = 0
EX_UNAVAILABLE = 69  # sysexits.h: the daemon gave no results; nothing changed
EX_SOFTWARE = 70  # scontrol could not read or change the node's record
NODENAME_ENV = "SLURMD_NODENAME"  # slurmd sets it for HealthCheckProgram


def slurm_node_name(given: str | None) -> str:
    """``--node-name``, else slurmd's ``SLURMD_NODENAME``, else the short host name (Slurm's default NodeName)."""
    return given or os.environ.get(NODENAME_ENV) or socket.gethostname().split(".")[0]


def slurm_health(
    config: Config, node_name: str, dry_run: bool, say: Callable[[str], None], run: CommandRunner | None = None
) -> int:
    """One health check of this node for Slurm; the exit status (see the module's docstring)."""
    runner = run if run is not None else config.environment().run_command
    try:
        doc = local_state(config, STATE_TIMEOUT_S)
    except DaemonUnavailable as exc:
        say(f"dgxdoctor slurm-health: UNKNOWN: {exc}; node {node_name} left as it is (no drain on unknown)")
        return EX_UNAVAILABLE
    try:
        record = show_node(runner, node_name, SCONTROL_TIMEOUT_S)
    except ScontrolError as exc:
        say(f"dgxdoctor slurm-health: cannot read the Slurm node {node_name}: {exc}")
        return EX_SOFTWARE
    decided = plan(doc, record)
    if decided.verb == "none":
        say(f"dgxdoctor slurm-health: {doc.status}: {decided.why}")
        return EX_OK
    argv = drain_argv(record.name, decided.reason or "") if decided.verb == "drain" else resume_argv(record.name)
    if dry_run:
        say(f"dgxdoctor slurm-health: would {decided.verb} {record.name}: {decided.why} ({' '.join(argv)})")
        return EX_OK
    try:
        update(runner, argv, SCONTROL_TIMEOUT_S)
    except ScontrolError as exc:
        say(f"dgxdoctor slurm-health: could not {decided.verb} {record.name}: {exc}")
        return EX_SOFTWARE
    done = f"drained with reason {decided.reason}" if decided.verb == "drain" else "resumed"
    say(f"dgxdoctor slurm-health: {record.name} {done}: {decided.why}")
    return EX_OK

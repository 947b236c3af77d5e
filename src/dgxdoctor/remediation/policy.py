"""Which findings and alerts lead to which action: pure functions, no clock, no I/O.

Three outcomes. ``restart_vllm`` for a serving process that is dead, hung or stalled; ``restart_cluster`` for a
Ray cluster that lost a node or GPUs, or NCCL/Gloo failing between the nodes; ``page`` for what no restart
cures (XIDs asking for a GPU reset or a reboot, IB links down, hardware and version drift): suggested to a
human, never acted on. The ladder: when ``restart_vllm`` did not cure a problem, its next occurrence gets
``restart_cluster``; when that did not either, the answer is ``page``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from msgspec import Struct

from dgxdoctor import codes
from dgxdoctor.judge.xid import page_resolutions
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.xid import UNKNOWN_XID_RESOLUTION

ActionName = Literal["restart_vllm", "restart_cluster", "page"]
RESTARTS: tuple[ActionName, ...] = ("restart_vllm", "restart_cluster")
LADDER: tuple[ActionName, ...] = ("restart_vllm", "restart_cluster", "page")

# vLLM check: refused connection (dead), /health timing out while idle (hung), /health 200 with work queued and
# no token counter moving for stall_s (engine hung: a KV or queue stall with no progress).
RESTART_VLLM_CODES = frozenset({codes.VLLM_DEAD, codes.VLLM_HUNG, codes.ENGINE_HUNG})
# Ray check: a node DEAD, fewer nodes or GPUs than planned (the tutorial's "GPU 8 of 16"), the local raylet gone;
# logs check: the NCCL/Gloo failure signatures of a broken collective between the nodes; the head's peer
# comparison: a worker of an mp deployment whose headless vLLM is gone or stopped (restarted in the mp order).
RESTART_CLUSTER_CODES = frozenset(
    {
        codes.RAY_NODE_DEAD,
        codes.RAY_NODES_MISSING,
        codes.RAY_GPUS_MISSING,
        codes.RAY_RAYLET_DOWN,
        codes.NCCL_NET_FAILURE,
        codes.NCCL_NETWORK_ERROR,
        codes.NCCL_TIMEOUT,
        codes.NCCL_SYSTEM_ERROR,
        codes.GLOO_SOCKET,
        "PEER_MP_WORKER_DOWN",
        # logs check: a worker or the driver lost the GCS (the head's control store) and exited.
        "RAY_GCS_UNREACHABLE",
    }
)
# Resolutions of NVIDIA's XID catalog that need a GPU reset, a reboot or a person: the classes of the one table
# (judge.xid.RESOLUTION_CLASSES) whose verdict is critical with an action no restart performs.
PAGE_XID_RESOLUTIONS = page_resolutions()
PAGE_CODES = frozenset(
    {
        codes.IB_PORT_DOWN,
        codes.IB_PORT_DISABLED,
        codes.IB_PORT_NOT_ACTIVE,
        codes.IB_LINK_FLAPPING,
        codes.PEER_HARDWARE_DRIFT,
        codes.PEER_VERSION_SKEW,
        codes.PEER_MODEL_MISMATCH,
        "PEER_MP_LAYOUT_DRIFT",
        # logs check signatures no restart cures: version drift between the nodes, a GPU or driver fault, the
        # container's /dev/shm or GPU set-up, the host's RAM (not a CUDA OOM), an unreachable MASTER_ADDR.
        "RAY_VERSION_MISMATCH",
        "GPU_LOST",
        "CUDA_ECC_ERROR",
        "CUDA_DRIVER_INIT",
        "NO_GPU_VISIBLE",
        "CUDA_P2P_UNSUPPORTED",
        "NCCL_DUPLICATE_GPU",
        "SHM_TOO_SMALL",
        "RAY_HOST_OOM",
        "TORCH_RENDEZVOUS_TIMEOUT",
    }
)


def action_for_code(code: str, xid_resolution: str | None = None) -> ActionName | None:
    """The action a finding code asks for; ``xid_resolution`` is the catalog's resolution for ``XID_<n>``."""
    if code in RESTART_VLLM_CODES:
        return "restart_vllm"
    if code in RESTART_CLUSTER_CODES:
        return "restart_cluster"
    if code in PAGE_CODES or (xid_resolution is not None and xid_resolution in PAGE_XID_RESOLUTIONS):
        return "page"
    return None


class Problem(Struct, frozen=True):
    """A condition remediation may answer. ``key`` identifies it across runs (same key, same problem)."""

    key: str
    action: ActionName
    source: Literal["check", "alert"]
    reason: str
    since: float | None = None  # when the condition began, if the source says (an alert's startsAt)


def problems_from_results(
    results: Iterable[CheckResult], xid_resolution: Mapping[int, str] | None = None
) -> list[Problem]:
    """One problem per (check, action): the critical findings of the latest results that ask for an action."""
    found: dict[str, Problem] = {}
    for result in results:
        for finding in result.findings:
            if finding.status is not Status.CRITICAL:
                continue
            resolution = None
            if finding.code.startswith(codes.XID_PREFIX) and xid_resolution is not None:
                number = finding.code.removeprefix(codes.XID_PREFIX)
                # An XID the catalog does not know is the catalog's CONTACT_SUPPORT, as the check says.
                resolution = xid_resolution.get(int(number), UNKNOWN_XID_RESOLUTION) if number.isdigit() else None
            action = action_for_code(finding.code, resolution)
            if action is None:
                continue
            key = f"check:{result.check}:{action}"
            if key not in found:
                subject = f" {finding.subject}" if finding.subject else ""
                found[key] = Problem(key, action, "check", f"{finding.code}{subject}: {finding.message}")
    return list(found.values())


def problem_from_alert(labels: Mapping[str, str], node: str, since: float | None) -> Problem | None:
    """A firing alert for ``node`` that carries ``dgxdoctor_action``; None when it is not ours to act on."""
    action = labels.get("dgxdoctor_action")
    if labels.get("node") != node or action not in RESTARTS:
        return None
    name = printable(labels.get("alertname", "alert"))[:MAX_ALERT_NAME]
    return Problem(f"alert:{name}:{action}", action, "alert", f"alert {name} firing", since)  # type: ignore[arg-type]


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

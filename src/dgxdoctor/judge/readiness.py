"""Whether this node's serving group is fit for traffic: the verdict behind ``GET /ready`` and the HAProxy agent.

vLLM's own ``/health`` stays 200 on a hung engine, so no balancer can tell by itself; this verdict reads what the
checks found. One state, worst first:

- ``restarting`` / ``draining``: remediation holds the node out (a restart, or the drain before it);
- ``down``: no vllm result yet or an unknown one (a missing source is never "ready"), vLLM still loading
  (VLLM_LOADING), vLLM dead or hung or any critical vllm finding, the engine making no progress (ENGINE_HUNG), a
  finding that asks for a cluster restart (a Ray node or a peer worker down, NCCL between the nodes failing), a
  dead NCCL RAS rank, a hardware cause here or relayed from the peer (``Cure.HARDWARE``);
- ``suspect``: requests running or waiting while the engine made no progress for ``suspect_after_s``: out of
  rotation without a restart (a long prefill costs a short absence), back when progress resumes;
- ``ready``.

Pure: the latest results and remediation's hold in, the verdict out. The hysteresis (``ready_after_good`` good
evaluations before ready again) is the daemon's (daemon/readiness.py), which counts check runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from msgspec import Struct

from dgxdoctor.judge.hardware_cause import PEER_CAUSE_CODE
from dgxdoctor.result import CheckResult, Cure, Finding, Status

State = Literal["ready", "suspect", "draining", "restarting", "down"]
STATES: tuple[State, ...] = ("ready", "suspect", "draining", "restarting", "down")
# Remediation's hold: leaving rotation before a restart, or the restart itself.
Hold = Literal["draining", "restarting"]
PROGRESS_METRIC = "dgxdoctor_vllm_seconds_since_progress"  # the vllm check's sample (checks/vllm.py)
RAS_DEAD = frozenset({"RAS_RANK_DEAD"})
# Not a fault (status OK, within the start-up grace) and not serving either: loading weights, profiling.
NOT_SERVING_YET = frozenset({"VLLM_LOADING"})


class Verdict(Struct, frozen=True):
    state: State
    reason: str

    @property
    def ready(self) -> bool:
        return self.state == "ready"


def _down_reason(check: str, f: Finding) -> str | None:
    """Why this finding takes the node out of rotation (down), or None."""
    where = f" {f.subject}" if f.subject else ""
    if f.cure is Cure.HARDWARE and (f.status is Status.CRITICAL or f.code == PEER_CAUSE_CODE):
        return f"hardware cause {f.code}{where}"
    if f.status is not Status.CRITICAL:
        return None
    if check == "vllm":
        return f"{f.code}{where}"
    if f.action == "restart_cluster":
        return f"{f.code}{where} (the serving group)"
    if f.code in RAS_DEAD:
        return f"{f.code}{where}"
    return None


def stall_s(vllm: CheckResult) -> float | None:
    """Seconds the engine made no progress while it had requests (0 when idle), as the vllm check measured."""
    return next((s.value for s in vllm.samples if s.metric.name == PROGRESS_METRIC), None)


def verdict(results: Mapping[str, CheckResult], hold: Hold | None, suspect_after_s: float) -> Verdict:
    """The state of this node for a balancer, from the checks' latest results and remediation's hold."""
    if hold is not None:
        return Verdict(hold, "a restart in progress" if hold == "restarting" else "draining before a restart")
    vllm = results.get("vllm")
    if vllm is None:
        return Verdict("down", "no vllm check result yet")
    if vllm.status in (Status.UNKNOWN, Status.SKIPPED):
        return Verdict("down", f"vllm check {vllm.status.value}: {vllm.summary}"[:200])
    for result in (vllm, *(r for name, r in sorted(results.items()) if name != "vllm")):
        for f in result.findings:
            why = _down_reason(result.check, f)
            if why is not None:
                return Verdict("down", why)
    loading = next((f for f in vllm.findings if f.code in NOT_SERVING_YET), None)
    if loading is not None:
        return Verdict("down", f"{loading.code}: not serving yet")
    if vllm.status is Status.CRITICAL:
        return Verdict("down", f"vllm check critical: {vllm.summary}"[:200])
    stalled = stall_s(vllm)
    if stalled is not None and stalled >= suspect_after_s:
        return Verdict("suspect", f"no engine progress for {stalled:.1f} s with requests in flight")
    return Verdict("ready", "fit for traffic")

"""What a signature match means given the lines around it (shared by the logs check and ``diagnose``).

A CUDA_OOM line reads as CUDA_OOM_STARTUP or CUDA_OOM_SERVING when the lines around it say which (``judge.oom``); a
VLLM_ENGINE_DEAD line right after a requested shutdown is no failure at all (``judge.shutdown``), nor is a
RAY_WORKER_DIED report of the GCS for the worker of an actor it has just destroyed on request (``judge.ray_exit``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dgxdoctor.judge.oom import oom_phase
from dgxdoctor.judge.ray_exit import requested_exit_before
from dgxdoctor.judge.shutdown import intended_stop_before
from dgxdoctor.judge.signatures import Signature

_OOM_BY_PHASE = {"startup": "CUDA_OOM_STARTUP", "serving": "CUDA_OOM_SERVING"}


def reading(sig: Signature, lines: Sequence[str], index: int, signatures: Mapping[str, Signature]) -> Signature | None:
    """The signature a match at ``lines[index]`` stands for, or None when the context explains it away."""
    if sig.code == "VLLM_ENGINE_DEAD" and intended_stop_before(lines, index):
        return None
    if sig.code == "RAY_WORKER_DIED" and requested_exit_before(lines, index):
        return None
    if sig.code != "CUDA_OOM":
        return sig
    phase = oom_phase(lines, index)
    return signatures.get(_OOM_BY_PHASE[phase], sig) if phase else sig

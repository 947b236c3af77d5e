"""``[remediation]``: observe or act, the guard's limits and the commands each step runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dgxdoctor.settings.base import Frozen

Argv = tuple[str, ...]


def _argv(*parts: str) -> Argv:
    return tuple(parts)


class RemediationCommands(Frozen):
    """What each step runs: argv lists (never a shell), defaults for the example units in systemd/.

    ``ray_stop``/``ray_start`` default to ray-head.service on the head and ray-worker.service on a worker.
    With ``[node] executor = "mp"`` the head's vLLM is ``stop_vllm``/``start_vllm`` (set them to
    vllm-head-mp.service) and a worker runs ``worker_vllm_stop``/``worker_vllm_start`` when the head asks.
    """

    restart_vllm: Argv = Field(_argv("systemctl", "restart", "vllm.service"), description="restart vLLM here")
    stop_vllm: Argv = Field(_argv("systemctl", "stop", "vllm.service"), description="cluster restart: stop vLLM")
    start_vllm: Argv = Field(_argv("systemctl", "start", "vllm.service"), description="cluster restart: start vLLM")
    ray_stop: Argv | None = Field(None, description="stop this node's Ray (default: systemctl stop ray-<role>.service)")
    ray_start: Argv | None = Field(
        None, description="start this node's Ray (default: systemctl start ray-<role>.service)"
    )
    worker_vllm_stop: Argv = Field(
        _argv("systemctl", "stop", "vllm-worker-mp.service"),
        description='executor "mp", on a worker: stop its headless vLLM when the head asks',
    )
    worker_vllm_start: Argv = Field(
        _argv("systemctl", "start", "vllm-worker-mp.service"),
        description='executor "mp", on a worker: start its headless vLLM when the head asks',
    )

    @field_validator(
        "restart_vllm", "stop_vllm", "start_vllm", "ray_stop", "ray_start", "worker_vllm_stop", "worker_vllm_start"
    )
    @classmethod
    def _non_empty(cls, value: Argv | None) -> Argv | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("an argv list needs at least the program")
        return value

    def ray(self, verb: Literal["stop", "start"], role: str) -> Argv:
        given = self.ray_stop if verb == "stop" else self.ray_start
        return given if given is not None else ("systemctl", verb, f"ray-{role}.service")

    def worker_argv(self, step: str) -> Argv:
        """What a worker runs for a step the head asks for (the engine's WORKER_STEPS)."""
        if step == "vllm_stop":
            return self.worker_vllm_stop
        if step == "vllm_start":
            return self.worker_vllm_start
        return self.ray("stop" if step == "ray_stop" else "start", "worker")


RemediationAction = Literal["restart_vllm", "restart_cluster", "page"]
DEFAULT_COOLDOWNS: dict[RemediationAction, float] = {"restart_vllm": 300.0, "restart_cluster": 900.0, "page": 3600.0}


class RemediationSettings(Frozen):
    """Remediation: decide on findings and alerts, and in act mode restart vLLM or the Ray cluster, within the
    guard's limits (docs/remediation.md)."""

    mode: Literal["observe", "act"] = Field(
        "observe", description="observe: decide, log, export, never run anything; act: run the actions"
    )
    role: Literal["head", "worker"] | None = Field(
        None,
        description="head: orchestrates cluster restarts (the node running vLLM and the Ray head); worker: runs its "
        "part only when the head asks over the authenticated API. Default: [node] role; required in act mode",
    )
    hold_s: float = Field(30.0, ge=0, description="a condition must hold this long (since it appeared) before acting")
    vllm_start_grace_s: float = Field(
        900.0, ge=0, description="no action while the vLLM process is younger than this (it is still loading)"
    )
    cooldown_s: dict[RemediationAction, float] = Field(
        default_factory=lambda: dict(DEFAULT_COOLDOWNS),
        description="per action: seconds after one before the next of the same kind",
    )
    budget: int = Field(3, ge=1, description="actions allowed per budget_window_s; one more opens the breaker")
    budget_window_s: float = Field(3600.0, gt=0, description="the budget's sliding window, seconds")
    ladder_window_s: float = Field(
        3600.0, gt=0, description="a problem back within this after a restart climbs the ladder (vLLM, cluster, page)"
    )
    command_timeout_s: float = Field(120.0, gt=0, description="each command's timeout, seconds")
    ray_ready_timeout_s: float = Field(
        300.0, gt=0, description="cluster restart: wait this long for all Ray nodes and GPUs"
    )
    verify_timeout_s: float = Field(
        1800.0, gt=0, description="wait this long for vLLM to answer /health, list the model and complete"
    )
    commands: RemediationCommands = RemediationCommands.model_construct()  # no schema unless named: config.py

    @model_validator(mode="after")
    def _role_when_acting(self) -> RemediationSettings:
        if self.mode == "act" and self.role is None:
            raise ValueError('mode = "act" needs [node] role = "head" or "worker" (only the head orchestrates)')
        return self

"""``[remediation]``: observe or act, the guard's limits and the commands each step runs."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, field

from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bounds import (
    HOUR_S,
    MAX_FLEET,
    WEEK_S,
    TimeoutUpToADay,
    TimeoutUpToAnHour,
    WaitUpToADay,
    WindowUpToAWeek,
)
from dgxdoctor.sources.container import Container

Argv = tuple[str, ...]


class RemediationCommands(Frozen, frozen=True):
    """What each step runs: argv lists (never a shell), defaults for the example units in systemd/.

    ``ray_stop``/``ray_start`` default to ray-head.service on the head and ray-worker.service on a worker.
    With ``[node] executor = "mp"`` the head's vLLM is ``stop_vllm``/``start_vllm`` (set them to
    vllm-head-mp.service) and a worker runs ``worker_vllm_stop``/``worker_vllm_start`` when the head asks.
    With ``[node] container`` set, vLLM's steps left unset go through the container runtime instead:
    ``docker restart|stop|start NAME`` (docs/container.md).
    """

    restart_vllm: Annotated[
        Argv | None,
        Meta(description="restart vLLM here (default: systemctl restart vllm.service; docker restart NAME)"),
    ] = None
    stop_vllm: Annotated[
        Argv | None,
        Meta(description="cluster restart: stop vLLM (default: systemctl stop vllm.service; docker stop NAME)"),
    ] = None
    start_vllm: Annotated[
        Argv | None,
        Meta(description="cluster restart: start vLLM (default: systemctl start vllm.service; docker start NAME)"),
    ] = None
    ray_stop: Annotated[
        Argv | None, Meta(description="stop this node's Ray (default: systemctl stop ray-<role>.service)")
    ] = None
    ray_start: Annotated[
        Argv | None, Meta(description="start this node's Ray (default: systemctl start ray-<role>.service)")
    ] = None
    worker_vllm_stop: Annotated[
        Argv | None,
        Meta(
            description='executor "mp", on a worker: stop its headless vLLM when the head asks (default: '
            "systemctl stop vllm-worker-mp.service; docker stop NAME)"
        ),
    ] = None
    worker_vllm_start: Annotated[
        Argv | None,
        Meta(
            description='executor "mp", on a worker: start its headless vLLM when the head asks (default: '
            "systemctl start vllm-worker-mp.service; docker start NAME)"
        ),
    ] = None

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            argv = getattr(self, name)
            if argv is not None and (not argv or not argv[0]):
                raise ValueError(f"{name}: an argv list needs at least the program")

    def vllm(self, verb: Literal["restart", "stop", "start"], container: Container | None = None) -> Argv:
        """vLLM's own step here: as configured, else through ``container``'s runtime, else vllm.service."""
        given = {"restart": self.restart_vllm, "stop": self.stop_vllm, "start": self.start_vllm}[verb]
        if given is not None:
            return given
        return tuple(container.argv(verb)) if container is not None else ("systemctl", verb, "vllm.service")

    def ray(self, verb: Literal["stop", "start"], role: str) -> Argv:
        given = self.ray_stop if verb == "stop" else self.ray_start
        return given if given is not None else ("systemctl", verb, f"ray-{role}.service")

    def worker_argv(self, step: str, container: Container | None = None) -> Argv:
        """What a worker runs for a step the head asks for (the engine's WORKER_STEPS)."""
        if step in ("vllm_stop", "vllm_start"):
            verb: Literal["stop", "start"] = "stop" if step == "vllm_stop" else "start"
            given = self.worker_vllm_stop if verb == "stop" else self.worker_vllm_start
            if given is not None:
                return given
            if container is not None:
                return tuple(container.argv(verb))
            return ("systemctl", verb, "vllm-worker-mp.service")
        return self.ray("stop" if step == "ray_stop" else "start", "worker")


RemediationAction = Literal["restart_vllm", "restart_cluster", "page"]
DEFAULT_COOLDOWNS: dict[RemediationAction, float] = {"restart_vllm": 300.0, "restart_cluster": 900.0, "page": 3600.0}


class RemediationSettings(Frozen, frozen=True):
    """Remediation: decide on findings and alerts, and in act mode restart vLLM or the Ray cluster, within the
    guard's limits (docs/remediation.md)."""

    mode: Annotated[
        Literal["observe", "act"],
        Meta(description="observe: decide, log, export, never run anything; act: run the actions"),
    ] = "observe"
    role: Annotated[
        Literal["head", "worker"] | None,
        Meta(
            description="head: orchestrates cluster restarts (the node running vLLM and the Ray head); "
            "worker: runs its part only when the head asks over the authenticated API. "
            "Default: [node] role; required in act mode"
        ),
    ] = None
    hold_s: Annotated[
        WaitUpToADay, Meta(description="a condition must hold this long (since it appeared) before acting")
    ] = 30.0
    vllm_start_grace_s: Annotated[
        WaitUpToADay, Meta(description="no action while the vLLM process is younger than this (it is still loading)")
    ] = 900.0
    cooldown_s: Annotated[
        dict[RemediationAction, Annotated[float, Meta(ge=0, le=WEEK_S)]],
        Meta(description="per action: seconds after one before the next of the same kind"),
    ] = field(default_factory=lambda: dict(DEFAULT_COOLDOWNS))
    budget: Annotated[
        int, Meta(ge=1, le=1000, description="actions allowed per budget_window_s; one more opens the breaker")
    ] = 3
    budget_window_s: Annotated[WindowUpToAWeek, Meta(description="the budget's sliding window, seconds")] = 3600.0
    ladder_window_s: Annotated[
        WindowUpToAWeek,
        Meta(description="a problem back within this after a restart climbs the ladder (vLLM, cluster, page)"),
    ] = 3600.0
    command_timeout_s: Annotated[TimeoutUpToAnHour, Meta(description="each command's timeout, seconds")] = 120.0
    ray_ready_timeout_s: Annotated[
        TimeoutUpToADay, Meta(description="cluster restart: wait this long for all Ray nodes and GPUs")
    ] = 300.0
    verify_timeout_s: Annotated[
        TimeoutUpToADay, Meta(description="wait this long for vLLM to answer /health, list the model and complete")
    ] = 1800.0
    fleet_breaker_fraction: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description="the fleet breaker: no restart while more than this fraction of the fleet's nodes or serving "
            "groups is unhealthy at once (a fabric fault, a bad rollout); pages instead (docs/fleet.md)",
        ),
    ] = 0.2
    fleet_breaker_min_nodes: Annotated[
        int,
        Meta(
            ge=2,
            le=MAX_FLEET,
            description="the fleet breaker counts nodes only in a fleet of at least this many (on two nodes one "
            "fault is half the fleet)",
        ),
    ] = 5
    fleet_breaker_min_groups: Annotated[
        int,
        Meta(ge=2, le=MAX_FLEET, description="the fleet breaker counts groups only when there are at least this many"),
    ] = 3
    drain: Annotated[
        bool,
        Meta(
            description="a restart leaves the balancer's rotation first and waits for in-flight requests "
            '(docs/remediation.md, "Out of rotation"); off: the cold restart'
        ),
    ] = True
    drain_timeout_s: Annotated[
        float,
        Meta(
            ge=0,
            le=HOUR_S,
            description="drain: wait at most this long for vLLM's running and waiting requests to reach 0",
        ),
    ] = 120.0
    balancer_period_s: Annotated[
        float,
        Meta(
            ge=0,
            le=600,
            description="drain: how long the balancer takes to see the node leave (its agent or health check "
            "interval times its fall count); waited before the drain counts, and before restarting a hung engine",
        ),
    ] = 5.0
    rejoin_timeout_s: Annotated[
        TimeoutUpToAnHour, Meta(description="after a verified restart: wait this long for /ready to say ready again")
    ] = 120.0
    commands: RemediationCommands = RemediationCommands()  # no schema unless named: config.py

    def __post_init__(self) -> None:
        if self.mode == "act" and self.role is None:
            raise ValueError('mode = "act" needs [node] role = "head" or "worker" (only the head orchestrates)')

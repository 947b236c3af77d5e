"""The shape of ``remediation-state.json``, validated with the same rigour as the config.

The file decides whether root restarts services, so a document that is not exactly what the daemon writes is
refused whole (``StateDocError`` naming the first key path that is wrong), never half-read: ``{"in_flight":
{"bogus": 1}}`` or ``{"breaker": "open"}`` are errors, not a crash and not a reset. Every collection is bounded
(the webhook's alert names and the worker's step requests land here) and every time is a finite number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

STATE_VERSION: Literal[1] = 1
MAX_ACTIONS = 1000  # the budget's window: far above any budget an operator sets
MAX_KEYS = 256  # problem keys (onset), ladder entries, cooldowns
MAX_STEPS = 256  # worker step requests remembered for replay protection
MAX_TEXT = 512

Action = Literal["restart_vllm", "restart_cluster", "page"]
Step = Literal["ray_stop", "ray_start", "vllm_stop", "vllm_start"]
Key = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]


class StateDocError(ValueError):
    """The state file is not a valid remediation state; the message names where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class BreakerDoc(_Strict):
    open: bool = False
    reason: str | None = Field(None, max_length=MAX_TEXT)
    opened_at: float | None = None


class StampDoc(_Strict):
    action: Action
    at: float


class InFlightDoc(_Strict):
    id: str = Field(pattern=r"^[0-9a-f]{1,64}$")
    action: Action
    key: str = Field(min_length=1, max_length=MAX_TEXT)
    started_at: float
    pid: int = Field(ge=0)


class StepDoc(_Strict):
    """A step request a worker ran (or refused as a replay): its id, step and the head's timestamp."""

    id: str = Field(pattern=r"^[0-9a-f]{12,64}$")
    step: Step
    at: float


class StateDoc(_Strict):
    version: Literal[1] = STATE_VERSION
    breaker: BreakerDoc = Field(default_factory=BreakerDoc)
    actions: list[StampDoc] = Field(default_factory=list, max_length=MAX_ACTIONS)
    last: dict[Key, float] = Field(default_factory=dict, max_length=MAX_KEYS)
    attempts: dict[Action, Annotated[list[StampDoc], Field(max_length=MAX_ACTIONS)]] = Field(default_factory=dict)
    onset: dict[Key, float] = Field(default_factory=dict, max_length=MAX_KEYS)
    in_flight: InFlightDoc | None = None
    finished_at: float | None = None
    steps: list[StepDoc] = Field(default_factory=list, max_length=MAX_STEPS)


def validate_state(doc: Any) -> StateDoc:
    """The validated document; StateDocError naming the first problem."""
    try:
        return StateDoc.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise StateDocError(f"{where}: {first['msg']}{more}") from None

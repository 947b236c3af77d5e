"""The shape of ``remediation-state.json``, validated with the same rigour as the config.

The file decides whether root restarts services, so a document that is not exactly what the daemon writes is
refused whole (``StateDocError`` naming the first key path that is wrong), never half-read: ``{"in_flight":
{"bogus": 1}}`` or ``{"breaker": "open"}`` are errors, not a crash and not a reset. Every collection is bounded
(the webhook's alert names and the worker's step requests land here) and every time is a finite number.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

from dgxdoctor.validation import validate

STATE_VERSION: Literal[1] = 1
MAX_ACTIONS = 1000  # the budget's window: far above any budget an operator sets
MAX_KEYS = 256  # problem keys (onset), ladder entries, cooldowns
MAX_STEPS = 256  # worker step requests remembered for replay protection
MAX_TEXT = 512

Action = Literal["restart_vllm", "restart_cluster", "page"]
Step = Literal["ray_stop", "ray_start", "vllm_stop", "vllm_start"]
Key = Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]


# A time or a count in the file: a finite number (JSON's NaN and Infinity extensions refused: neither lies within
# the largest floats).
Finite = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]


class StateDocError(ValueError):
    """The state file is not a valid remediation state; the message names where."""


class _Strict(Struct, forbid_unknown_fields=True, kw_only=True):
    """Exactly the keys the daemon writes."""


class BreakerDoc(_Strict):
    open: bool = False
    reason: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
    opened_at: Finite | None = None


class StampDoc(_Strict):
    action: Action
    at: Finite


class InFlightDoc(_Strict):
    id: Annotated[str, Meta(pattern=r"^[0-9a-f]{1,64}\Z")]
    action: Action
    key: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]
    started_at: Finite
    pid: Annotated[int, Meta(ge=0)]


class StepDoc(_Strict):
    """A step request a worker ran (or refused as a replay): its id, step and the head's timestamp."""

    id: Annotated[str, Meta(pattern=r"^[0-9a-f]{12,64}\Z")]
    step: Step
    at: Finite


class StateDoc(_Strict):
    version: Literal[1] = STATE_VERSION
    breaker: BreakerDoc = field(default_factory=BreakerDoc)
    actions: Annotated[list[StampDoc], Meta(max_length=MAX_ACTIONS)] = field(default_factory=list)
    last: Annotated[dict[Key, Finite], Meta(max_length=MAX_KEYS)] = field(default_factory=dict)
    attempts: dict[Action, Annotated[list[StampDoc], Meta(max_length=MAX_ACTIONS)]] = field(default_factory=dict)
    onset: Annotated[dict[Key, Finite], Meta(max_length=MAX_KEYS)] = field(default_factory=dict)
    in_flight: InFlightDoc | None = None
    finished_at: Finite | None = None
    steps: Annotated[list[StepDoc], Meta(max_length=MAX_STEPS)] = field(default_factory=list)
    dry_run: bool = False  # observe mode rehearsed actions here (guard.rehearse): act mode forgets them


def validate_state(doc: Any) -> StateDoc:
    """The validated document; StateDocError naming the first problem."""
    try:
        return validate(StateDoc, doc)
    except msgspec.ValidationError as exc:
        raise StateDocError(str(exc)) from None

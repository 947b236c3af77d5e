"""Alertmanager's webhook in: the version 4 payload, validated field by field.

The shape (Alertmanager's ``notify/webhook`` package): ``{"version": "4", "groupKey", "status", "receiver",
"groupLabels", "commonLabels", "commonAnnotations", "externalURL", "alerts": [{"status", "labels",
"annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}]}``. Only what remediation uses is required:
``version``, ``alerts`` and, per alert, ``status``, ``labels`` (string values), ``startsAt`` and ``fingerprint``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct, field

from dgxdoctor.validation import decode_json

MAX_ALERTS = 1000


class PayloadError(ValueError):
    """The body is not an Alertmanager version 4 webhook payload; the message names what is wrong."""


class IncomingAlert(Struct, frozen=True):
    status: str  # firing | resolved
    labels: dict[str, str]
    fingerprint: str
    starts_at: str
    started: float | None  # startsAt as Unix time (parse_payload refuses one that does not parse)


def _timestamp(text: str) -> float | None:
    """RFC 3339 as Go writes it (Alertmanager's ``startsAt``): 0 to 9 fractional digits, ``Z`` or an offset.
    Python 3.10's ``fromisoformat`` reads only 3 or 6 digits: the fraction is cut or padded to 6 first."""
    text = text.replace("Z", "+00:00")
    dot = text.find(".")
    if dot != -1:
        end = dot + 1
        while end < len(text) and text[end].isdigit():
            end += 1
        text = text[: dot + 1] + text[dot + 1 : end][:6].ljust(6, "0") + text[end:]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class AlertDoc(Struct, frozen=True):
    """One alert of the payload: what remediation reads of it (Alertmanager's other keys are ignored)."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    fingerprint: Annotated[str, Meta(min_length=1, max_length=64)]
    starts_at: Annotated[str, Meta(max_length=64)] = field(name="startsAt")

    def __post_init__(self) -> None:
        if _timestamp(self.starts_at) is None:  # the replay protection orders episodes by it
            raise ValueError(f"startsAt: expected an RFC 3339 time, got {self.starts_at[:40]!r}")


class Payload(Struct, frozen=True):
    """Alertmanager's webhook payload, version 4."""

    version: Literal["4"]
    alerts: Annotated[list[AlertDoc], Meta(max_length=MAX_ALERTS)]


def parse_payload(raw: bytes) -> list[IncomingAlert]:
    """The alerts of a webhook body; PayloadError with msgspec's message (what and where) otherwise."""
    try:
        payload = decode_json(raw, Payload)
    except msgspec.ValidationError as exc:
        raise PayloadError(f"payload: {str(exc)[:300]}") from None
    except msgspec.DecodeError as exc:
        raise PayloadError(f"body is not JSON: {str(exc)[:120]}") from None
    return [
        IncomingAlert(a.status, a.labels, a.fingerprint, a.starts_at, _timestamp(a.starts_at)) for a in payload.alerts
    ]

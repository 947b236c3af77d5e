"""Alertmanager's webhook in: the version 4 payload, validated field by field.

The shape (Alertmanager's ``notify/webhook`` package): ``{"version": "4", "groupKey", "status", "receiver",
"groupLabels", "commonLabels", "commonAnnotations", "externalURL", "alerts": [{"status", "labels",
"annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}]}``. Only what remediation uses is required:
``version``, ``alerts`` and, per alert, ``status``, ``labels`` (string values), ``startsAt`` and ``fingerprint``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from msgspec import Struct

MAX_ALERTS = 1000


class PayloadError(ValueError):
    """The body is not an Alertmanager version 4 webhook payload; the message names what is wrong."""


class IncomingAlert(Struct, frozen=True):
    status: str  # firing | resolved
    labels: dict[str, str]
    fingerprint: str
    starts_at: str
    started: float | None  # startsAt as Unix time (parse_payload refuses one that does not parse)


def _field(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in obj:
        raise PayloadError(f"{where}: missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise PayloadError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


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


def parse_payload(raw: bytes) -> list[IncomingAlert]:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"body is not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise PayloadError(f"body must be a JSON object, got {type(doc).__name__}")
    version = _field(doc, "version", str, "payload")
    if version != "4":
        raise PayloadError(f'payload.version: expected "4" (Alertmanager\'s webhook), got {version!r}')
    alerts = _field(doc, "alerts", list, "payload")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"payload.alerts: {len(alerts)} alerts, at most {MAX_ALERTS}")
    return [_alert(item, f"payload.alerts[{i}]") for i, item in enumerate(alerts)]


def _alert(item: Any, where: str) -> IncomingAlert:
    if not isinstance(item, dict):
        raise PayloadError(f"{where}: expected object, got {type(item).__name__}")
    status = _field(item, "status", str, where)
    if status not in ("firing", "resolved"):
        raise PayloadError(f'{where}.status: expected "firing" or "resolved", got {status[:40]!r}')
    labels = _field(item, "labels", dict, where)
    for key, value in labels.items():
        if not isinstance(value, str):
            raise PayloadError(f"{where}.labels.{key[:60]}: expected string, got {type(value).__name__}")
    fingerprint = _field(item, "fingerprint", str, where)
    if not fingerprint or len(fingerprint) > 64:
        raise PayloadError(f"{where}.fingerprint: expected 1-64 characters")
    starts_at = _field(item, "startsAt", str, where)
    started = _timestamp(starts_at[:64])
    if started is None:  # the replay protection orders episodes by it: a time, or the payload is refused
        raise PayloadError(f"{where}.startsAt: expected an RFC 3339 time, got {starts_at[:40]!r}")
    return IncomingAlert(status, dict(labels), fingerprint, starts_at[:64], started)

"""Fetch and validate peers' ``/state`` documents. Everything a peer sends is untrusted input."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

MAX_STATE_BYTES = 4 * 2**20
MAX_CHECKS = 200
MAX_SAMPLES = 20_000
MAX_FACTS = 2_000
MAX_TEXT = 4_096


class InvalidState(ValueError):
    """A peer answered, but not with a usable /state document."""


@dataclass(frozen=True)
class PeerFetch:
    url: str
    label: str
    state: dict[str, Any] | None
    error: str | None
    seconds: float
    timed_out: bool = False

    @property
    def up(self) -> bool:
        return self.state is not None


def peer_label(url: str) -> str:
    """The ``peer`` label: host:port of the configured URL (stable even when the peer is down)."""
    parts = urlsplit(url)
    return parts.netloc or url


def fetch_state(client: httpx.Client, url: str, token: str | None, timeout_s: float) -> PeerFetch:
    """GET ``url/state`` with the token; never raises: a failure is an error text on the result."""
    import time

    t0 = time.monotonic()
    label = peer_label(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with client.stream("GET", f"{url}/state", headers=headers, timeout=timeout_s) as response:
            if response.status_code != 200:
                hint = (
                    " (token rejected: set the same daemon.token on both nodes)"
                    if response.status_code
                    in (
                        401,
                        403,
                    )
                    else ""
                )
                raise InvalidState(f"HTTP {response.status_code}{hint}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_STATE_BYTES:
                    raise InvalidState(f"answer larger than {MAX_STATE_BYTES} bytes")
                # httpx's timeout bounds each read, not the whole answer: a peer trickling bytes would hold
                # this check (and its thread) for as long as it likes.
                if time.monotonic() - t0 > timeout_s:
                    raise httpx.ReadTimeout(f"answer not complete within {timeout_s:g} s")
        state = validate_state(response_json(bytes(body)))
    except httpx.TimeoutException as exc:
        what = str(exc) if "not complete" in str(exc) else f"no answer within {timeout_s:g} s"
        return PeerFetch(url, label, None, f"timed out: {what}", time.monotonic() - t0, True)
    except httpx.HTTPError as exc:
        return PeerFetch(url, label, None, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
    except InvalidState as exc:
        return PeerFetch(url, label, None, f"invalid /state: {exc}", time.monotonic() - t0)
    return PeerFetch(url, label, state, None, time.monotonic() - t0)


def response_json(body: bytes) -> Any:
    import json

    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise InvalidState(f"not JSON ({exc})") from None


def validate_state(doc: Any) -> dict[str, Any]:
    """Keep only the well-formed parts a comparison reads; raise InvalidState naming the first bad part."""
    if not isinstance(doc, dict):
        raise InvalidState("top level is not an object")
    node = doc.get("node")
    if not isinstance(node, str) or not node or len(node) > 253:
        raise InvalidState("'node' must be a non-empty string")
    checks = doc.get("checks")
    if not isinstance(checks, list) or len(checks) > MAX_CHECKS:
        raise InvalidState(f"'checks' must be a list of at most {MAX_CHECKS}")
    facts = doc.get("facts", {})
    if not isinstance(facts, dict) or len(facts) > MAX_FACTS:
        raise InvalidState(f"'facts' must be an object of at most {MAX_FACTS} keys")
    clean_checks: list[dict[str, Any]] = []
    total = 0
    for i, check in enumerate(checks):
        if not isinstance(check, dict) or not isinstance(check.get("name"), str):
            raise InvalidState(f"checks[{i}] is not an object with a 'name'")
        samples = check.get("samples", [])
        if not isinstance(samples, list):
            raise InvalidState(f"checks[{i}].samples is not a list")
        total += len(samples)
        if total > MAX_SAMPLES:
            raise InvalidState(f"more than {MAX_SAMPLES} samples")
        clean: list[dict[str, Any]] = []
        for j, sample in enumerate(samples):
            if not isinstance(sample, dict) or not isinstance(sample.get("name"), str):
                raise InvalidState(f"checks[{i}].samples[{j}] has no 'name'")
            labels = sample.get("labels", {})
            if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_TEXT for k, v in labels.items()
            ):
                raise InvalidState(f"checks[{i}].samples[{j}].labels must map strings to strings")
            value = sample.get("value")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InvalidState(f"checks[{i}].samples[{j}].value is not a number")
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            clean.append({"name": sample["name"], "labels": labels, "value": value})
        clean_checks.append(
            {"name": check["name"], "status": str(check.get("status", "unknown"))[:32], "samples": clean}
        )
    clean_facts: dict[str, str] = {}
    for key, value in facts.items():
        if not isinstance(value, str) or len(key) > 256 or len(value) > MAX_TEXT:
            raise InvalidState(f"facts[{key[:64]!r}] must be a string of at most {MAX_TEXT} characters")
        clean_facts[key] = value
    return {
        "node": node,
        "status": str(doc.get("status", "unknown"))[:32],
        "checks": clean_checks,
        "facts": clean_facts,
    }

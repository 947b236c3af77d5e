"""Fetch and validate peers' ``/state`` documents. Everything a peer sends is untrusted input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from dgxdoctor.result import ResultsDocument

MAX_STATE_BYTES = 4 * 2**20


class InvalidState(ValueError):
    """A peer answered, but not with a usable /state document."""


@dataclass(frozen=True)
class PeerFetch:
    url: str
    label: str
    state: dict[str, Any] | None
    error: str | None
    seconds: float

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
                    raise InvalidState(f"answer not complete within {timeout_s:g} s")
        state = validate_state(response_json(bytes(body)))
    except httpx.TimeoutException:
        return PeerFetch(url, label, None, f"no answer within {timeout_s:g} s", time.monotonic() - t0)
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
    """The parts a comparison reads of a peer's /state, validated by the results document's model
    (``result.ResultsDocument``); InvalidState naming the first bad part."""
    try:
        return ResultsDocument.model_validate(doc).compared()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidState(f"{_where(first['loc'])}: {first['msg']}") from None
    except RecursionError:  # nesting deeper than the validator's stack
        raise InvalidState("nested too deeply") from None


def _where(loc: tuple[int | str, ...]) -> str:
    """("checks", 0, "samples", 2, "value") -> "checks[0].samples[2].value"; a top-level key quoted."""
    if not loc:
        return "top level"
    if len(loc) == 1:
        return f"'{loc[0]}'"
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text

"""Ask peers' agents and validate what they answer: the one home of the peer exchange (the peer comparison's
``GET /state`` here, ``check --cluster``'s ``POST /check/run`` and the clock probe in ``fleet/cluster.py``, the
bundle's ``POST /bundle/part`` in ``bundle/build.py``). Everything a peer sends is untrusted input: every answer is
read as a stream and refused at its byte cap (an error page and ``/healthz`` included), sent uncompressed (a
compressed answer could grow a thousandfold past the cap as it is decoded), held to the caller's one deadline from
connect to last byte, its status and JSON checked (no NaN or infinity: JSON has none), its document validated by
the results model, and a failure worded the same way whoever asked."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import msgspec
from msgspec import Struct

from dgxdoctor.compat import aio
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.validation import validate

MAX_STATE_BYTES = 4 * 2**20
# Of an answer that is not 200: enough for the peer's ``error`` text, never the whole of a large body.
MAX_ERROR_BYTES = 4096
# Peers' answers are asked for and accepted uncompressed only (see the module's docstring).
IDENTITY = {"Accept-Encoding": "identity"}
MAX_PARALLEL_FETCHES = 8
STATE_PATH = "/state"
T = TypeVar("T")


class BadAnswer(ValueError):
    """A peer answered, but not usably: another status than 200, too large, not JSON, or not a valid results
    document (its ``/state``, or ``/check/run``'s answer)."""


class PeerFetch(Struct, frozen=True):
    url: str
    label: str
    state: dict[str, Any] | None  # what the comparison reads (``validate_state``)
    error: str | None
    seconds: float
    timed_out: bool = False  # no (complete) answer within the deadline: counted as a probe timeout
    # The whole validated /state, as the status page shows it (``fleet.peer_states``); a Struct, not dicts: it is
    # held between comparisons.
    document: ResultsDocument | None = None
    fetched_at: float = 0.0  # wall clock of the answer (or the failure)

    @property
    def up(self) -> bool:
        return self.state is not None


def peer_label(url: str) -> str:
    """The ``peer`` label: host:port of the configured URL (stable even when the peer is down)."""
    parts = urlsplit(url)
    return parts.netloc or url


async def fetch_state(client: httpx.AsyncClient, url: str, token: str | None, timeout_s: float) -> PeerFetch:
    """GET ``url/state`` with the token; never raises: a failure is an error text on the result.

    ``timeout_s`` bounds the whole exchange, connect to last byte: httpx's timeouts bound each read only, so a peer
    trickling its status line, headers or body a byte at a time would otherwise hold the fetch for ever. Cancelling
    the request at the deadline closes its connection.
    """
    t0 = time.monotonic()
    label = peer_label(url)

    def failed(error: str, timed_out: bool = False) -> PeerFetch:
        return PeerFetch(url, label, None, error, _since(t0), timed_out, fetched_at=time.time())

    try:
        body = await within(read_answer(client, "GET", f"{url}{STATE_PATH}", token), timeout_s)
        document = validated_document(response_json(body))
    except TimeoutError:
        return failed(f"timed out: no complete answer within {timeout_s:g} s", True)
    except httpx.TimeoutException:
        return failed(f"timed out: no answer within {timeout_s:g} s", True)
    except httpx.HTTPError as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    except BadAnswer as exc:
        return failed(f"invalid /state: {exc}")
    # validate_state's view, from the one validation
    return PeerFetch(url, label, document.compared(), None, _since(t0), document=document, fetched_at=time.time())


async def within(step: Awaitable[T], timeout_s: float) -> T:
    """``step`` cancelled at ``timeout_s`` (TimeoutError); 0 or less times out without starting it."""
    if timeout_s <= 0:
        if asyncio.iscoroutine(step):
            step.close()  # never awaited: no "was never awaited" warning
        raise TimeoutError
    return await aio.wait_for(step, timeout_s)


# What `check --cluster`, `bundle --cluster` and a refused peer say when this node has no peer token.
NO_PEER_TOKEN = (
    "no peer token configured on this node: the peers answer /state, /check/run and /bundle/part only with it; "
    "set [daemon] peer_token_file, the same file content on every node (README, Install)"
)


async def read_answer(
    client: httpx.AsyncClient, method: str, url: str, token: str | None, body: dict[str, Any] | None = None,
    max_bytes: int = MAX_STATE_BYTES,
) -> bytes:  # fmt: skip
    """The body of a 200 answer, at most ``max_bytes``; BadAnswer for another status (the peer's own ``error``
    text with it, and the token hint for 401/403) or a larger body."""
    status, data = await read_capped(client, method, url, token, body, max_bytes)
    if status != 200:
        hint = ""
        if status in (401, 403):
            hint = (
                f" ({NO_PEER_TOKEN})"
                if token is None
                else " (token rejected: the peers want the peer token, the same [daemon] peer_token_file on every node)"
            )
        raise BadAnswer(f"HTTP {status}{hint}: {_error_text(data[:300].decode('utf-8', 'replace'))}")
    return data


async def read_capped(
    client: httpx.AsyncClient, method: str, url: str, token: str | None = None, body: dict[str, Any] | None = None,
    max_bytes: int = MAX_STATE_BYTES,
) -> tuple[int, bytes]:  # fmt: skip
    """(status, body) of one exchange, the body read as it comes and refused (BadAnswer) at ``max_bytes`` + 1: a
    peer's answer never costs more memory than its cap, whatever it sends or claims. Only the first
    ``MAX_ERROR_BYTES`` of an answer other than 200 are read."""
    headers = {**IDENTITY, "Authorization": f"Bearer {token}"} if token else IDENTITY
    async with client.stream(method, url, headers=headers, json=body) as response:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BadAnswer(f"compressed answer refused (Content-Encoding: {encoding[:40]})")
        limit = max_bytes if response.status_code == 200 else MAX_ERROR_BYTES
        out = bytearray()
        async for chunk in response.aiter_bytes():  # no decoding: only identity passed above
            if len(out) + len(chunk) > limit:
                if response.status_code != 200:
                    out += chunk[: limit - len(out)]
                    break
                raise BadAnswer(f"answer larger than {max_bytes} bytes ({method} {urlsplit(url).path})")
            out += chunk
        return response.status_code, bytes(out)


def _error_text(text: str) -> str:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return text.strip()
    return str(doc.get("error", text)) if isinstance(doc, dict) else text.strip()


async def in_parallel(items: Sequence[str], ask: Callable[[str], Awaitable[T]], parallel: int) -> list[T]:
    """``ask`` for every item, at most ``parallel`` at a time, answers in the items' order."""
    gate = asyncio.Semaphore(parallel)

    async def one(item: str) -> T:
        async with gate:
            return await ask(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def _since(t0: float) -> float:
    return time.monotonic() - t0


def fetch_all(
    client_factory: Callable[[], httpx.AsyncClient],
    urls: Sequence[str],
    token: str | None,
    timeout_s: float,
    parallel: int = MAX_PARALLEL_FETCHES,
) -> list[PeerFetch]:
    """Fetch every peer, ``parallel`` at a time, on an event loop of the calling thread (a check's thread).

    The loop is closed without waiting for helper threads (a hung DNS lookup), so nothing here can hold up the
    check beyond the deadlines or the process at exit.
    """

    async def run() -> list[PeerFetch]:
        async with client_factory() as client:
            return await in_parallel(urls, lambda url: fetch_state(client, url, token, timeout_s), parallel)

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def response_json(body: bytes) -> Any:
    """A peer's JSON answer. NaN, Infinity and numbers past a float's range (``1e400``) are not JSON's numbers
    (Python's parser reads them): each is read as null, so it is absent where a value may be (a sample's value, a
    document's ``generated_at``) and refused by validation where one is required; nothing non-finite travels on
    into ``check --cluster --json``."""
    try:
        return json.loads(body, parse_constant=_absent, parse_float=_finite_or_none)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise BadAnswer(f"not JSON ({exc})") from None


def _absent(_: str) -> None:
    return None


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def validated_document(doc: Any) -> ResultsDocument:
    """A peer's results document through the results model (sizes bounded); BadAnswer with msgspec's message,
    naming the first bad part (``... - at `$.checks[0].samples[2].value```)."""
    try:
        return validate(ResultsDocument, doc)
    except msgspec.ValidationError as exc:
        raise BadAnswer(str(exc)) from None
    except RecursionError:  # nesting deeper than the validator's stack
        raise BadAnswer("nested too deeply") from None


def validate_state(doc: Any) -> dict[str, Any]:
    """The parts a comparison reads of a peer's /state (``validated_document``)."""
    return validated_document(doc).compared()

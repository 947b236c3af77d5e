"""The head's side of a cross-node probe: ask the peer's agent to join, run rank 0 here, fetch the peer's table.

The request goes over the peer's authenticated API (``POST /nccl/join`` with the shared daemon token, answered by
``daemon.nccl_join``); the peer starts its ranks with its own serving Python and NCCL env file, both sides meet in
one rendezvous at ``master_addr:master_port`` here. Whatever the peer does (refuses, never answers, never joins),
this side ends within ``join_timeout_s`` plus the probe's own run: the rendezvous has a deadline, every HTTP call a
timeout.

By hand: ``curl -H "Authorization: Bearer $TOKEN" -d '{...}' http://dgx-b:9835/nccl/join``, then the probe here
with ``--nnodes 2 --node-rank 0``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from dgxdoctor.checks.nccl_run import EX_PEER_MISSING, ProbeRun
from dgxdoctor.environment import Environment

if TYPE_CHECKING:
    import httpx

# What a peer's answer may carry back: the probe's output is a table and NCCL's INFO lines.
MAX_OUTPUT_CHARS = 1 << 20
POLL_S = 0.5
PEER_AFTER_OK_S = 30.0
PEER_AFTER_FAILURE_S = 5.0
HTTP_TIMEOUT_S = 10.0


class PeerRefused(Exception):
    """The peer answered but will not run the probe now (it is serving, or already probing)."""


def run_cross_node(
    env: Environment,
    peer: str,
    token: str | None,
    request: Callable[[str], Mapping[str, Any]],
    run_local: Callable[[], ProbeRun],
    rail: str | None,
) -> ProbeRun:
    """Ask ``peer``'s agent to join (``request(run_id)`` is the join request), run this node's ranks, fetch its side."""
    import httpx

    peer = peer.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    run_id = secrets.token_hex(16)
    with env.http_client(timeout_s=HTTP_TIMEOUT_S, peer=True) as client:
        try:
            answer = client.post(f"{peer}/nccl/join", json=dict(request(run_id)), headers=headers)
        except httpx.HTTPError as exc:
            return ProbeRun(
                EX_PEER_MISSING, "", "", rail, peer_error=f"{peer} unreachable: {type(exc).__name__}: {exc}"
            )
        if answer.status_code == 409:
            raise PeerRefused(f"{peer}: {_error_text(answer)}")
        if answer.status_code != 202:
            why = f"{peer} answered HTTP {answer.status_code}: {_error_text(answer)}"
            return ProbeRun(EX_PEER_MISSING, "", "", rail, peer_error=why)
        local = run_local()
        # Both sides end together once the collectives are done; after a failure here the peer's ranks notice
        # within seconds (the rendezvous is gone), so only a short wait for its output.
        deadline = time.monotonic() + (PEER_AFTER_OK_S if local.returncode == 0 else PEER_AFTER_FAILURE_S)
        peer_run, error = fetch_result(client, peer, run_id, headers, deadline, rail)
    return replace(local, peer=peer_run, peer_error=error)


def fetch_result(
    client: httpx.Client, peer: str, run_id: str, headers: dict[str, str], deadline: float, rail: str | None
) -> tuple[ProbeRun | None, str | None]:
    """Poll ``GET /nccl/join/<id>`` until the peer's probe is done or the deadline passes."""
    import httpx

    while True:
        error: str | None = None
        try:
            answer = client.get(f"{peer}/nccl/join/{run_id}", headers=headers)
            doc = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            doc, error = None, f"{type(exc).__name__}: {exc}"
        else:
            error = None if doc is not None else f"HTTP {answer.status_code}: {_error_text(answer)}"
        if isinstance(doc, dict) and doc.get("state") == "done":
            parsed = parse_result(doc, rail)
            return (parsed, None) if parsed is not None else (None, "the peer's result is malformed")
        if time.monotonic() > deadline:
            return None, error or "the peer's probe did not finish in time"
        time.sleep(POLL_S)


def parse_result(doc: dict[str, Any], rail: str | None) -> ProbeRun | None:
    """The peer's finished run, or None when any field is not what it should be (untrusted input)."""
    code, out, err, has_ib = doc.get("returncode"), doc.get("stdout"), doc.get("stderr"), doc.get("has_ib")
    if isinstance(code, bool) or not isinstance(code, int) or not isinstance(out, str) or not isinstance(err, str):
        return None
    return ProbeRun(code, out[-MAX_OUTPUT_CHARS:], err[-MAX_OUTPUT_CHARS:], rail, has_ib=has_ib is True)


def _error_text(answer: httpx.Response) -> str:
    try:
        doc = answer.json()
    except ValueError:
        return answer.text[:200]
    return str(doc.get("error", doc))[:300] if isinstance(doc, dict) else str(doc)[:300]

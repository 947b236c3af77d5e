"""The whole cluster from one node: every peer's results over the authenticated API, side by side with ours.

By hand: ``dgxdoctor check --json`` on every node and ``jq`` over the documents. Here one node asks every peer's
daemon to run its checks now (``POST /check/run``) or, with ``cached``, for its latest results (``GET /state``),
all in parallel under ONE deadline for the whole run; a peer that does not answer in time is that node UNKNOWN,
named, never a hang. Each exchange also measures the peer's clock against ours (the midpoint of the request, as
NTP's offset estimate does), so that timelines from both nodes line up. Everything a peer sends is untrusted: the
clock probe is part of the exchange, inside the same deadline and under a byte cap of its own, so a peer trickling
or flooding ``/healthz`` is that peer UNKNOWN, named, and the run still ends on time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
from msgspec import Struct, field
from msgspec.structs import replace

from dgxdoctor.documents import FindingDoc, ResultsDocument
from dgxdoctor.fleet.compare import Comparison, compare
from dgxdoctor.fleet.peers import (
    MAX_PARALLEL_FETCHES,
    STATE_PATH,
    BadAnswer,
    in_parallel,
    peer_label,
    read_answer,
    read_capped,
    response_json,
    validated_document,
    within,
)
from dgxdoctor.result import Status
from dgxdoctor.validation import validate

RUN_PATH = "/check/run"
# The peer needs a moment to answer after its checks' own deadline: asked to finish this much earlier.
PEER_MARGIN_S = 1.0


class NodeRun(Struct, frozen=True):
    """One node's part of a cluster run: its results document, or why there is none."""

    node: str
    url: str | None  # None for this node
    doc: dict[str, Any] | None  # the node's results document (``ResultsDocument.state()`` shape), validated
    error: str | None = None
    seconds: float = 0.0
    clock_offset_s: float | None = None  # the peer's clock minus ours; 0 for this node
    rtt_s: float | None = None  # the exchange's round trip, the offset's uncertainty is half of it
    cached: bool = False
    fetched_at: float | None = None  # wall clock of results fetched earlier (the status page's peers)
    # Where the document came from: "agent" (the node's own API) or "prometheus" (fleet.prom_view: statuses, codes
    # and subjects, no messages).
    source: str = "agent"

    @property
    def status(self) -> Status:
        if self.doc is None:
            return Status.UNKNOWN
        try:
            return Status(self.doc.get("status", "unknown"))
        except ValueError:
            return Status.UNKNOWN


class ClusterView(Struct, frozen=True):
    nodes: tuple[NodeRun, ...]
    comparison: Comparison = field(default_factory=Comparison)
    deadline_s: float | None = None

    @property
    def status(self) -> Status:
        statuses = [n.status for n in self.nodes] + [f.status for f in self.comparison.findings]
        return Status.worst(statuses, default=Status.OK)


async def ask_peer(
    client: httpx.AsyncClient, url: str, token: str | None, budget_s: float, cached: bool,
    clock: Callable[[], float] = time.time, until: float | None = None,
) -> NodeRun:  # fmt: skip
    """One peer's results and clock by ``until`` (``time.monotonic()``; default: ``budget_s`` from now), the whole
    exchange, clock probe included; never raises. A peer that has not answered by then is UNKNOWN, named with the
    request it left unanswered."""
    label = peer_label(url)
    t0 = time.monotonic()
    end = t0 + budget_s if until is None else until
    body = None if cached else {"deadline_s": round(max(end - t0 - PEER_MARGIN_S, 1.0), 3)}
    method, path = ("GET", STATE_PATH) if cached else ("POST", RUN_PATH)
    waiting = [f"{method} {path}"]  # the request in flight, for the error text

    async def exchange() -> tuple[dict[str, Any], float | None, float | None]:
        answer = response_json(await read_answer(client, method, f"{url}{path}", token, body))
        if not cached and not isinstance(answer, dict):
            raise BadAnswer("not a JSON object")
        doc = validated_document(answer if cached else answer.get("results")).state()
        waiting[0] = f"GET {HEALTHZ_PATH} (its clock)"
        offset, rtt = await measure_clock(client, url, clock)
        return doc, offset, rtt

    if end - t0 <= 0:  # it waited for a free slot until the deadline
        error = f"not asked: the deadline ({budget_s:.1f} s) passed while other peers were asked first"
        return NodeRun(label, url, None, error, 0.0)
    try:
        doc, offset, rtt = await within(exchange(), end - t0)
    except TimeoutError:
        error = f"no answer to {waiting[0]} within the deadline ({budget_s:.1f} s)"
        return NodeRun(label, url, None, error, _since(t0))
    except (httpx.HTTPError, BadAnswer) as exc:
        return NodeRun(label, url, None, f"{type(exc).__name__}: {exc}"[:400], _since(t0))
    return NodeRun(str(doc["node"]), url, doc, None, _since(t0), offset, rtt, cached)


CLOCK_SAMPLES = 3
HEALTHZ_PATH = "/healthz"
# /healthz is a few hundred bytes (``Daemon.health``); an answer past this is refused, and the peer with it.
MAX_HEALTHZ_BYTES = 16 * 2**10


async def measure_clock(
    client: httpx.AsyncClient, url: str, clock: Callable[[], float] = time.time
) -> tuple[float | None, float | None]:
    """The peer's clock offset from ``GET /healthz`` (its ``clock``), the sample of least delay of a few (NTP's
    filter: the shortest round trip is the least asymmetric). The connection is open by now, so no handshake
    lengthens one direction only. (None, None) when the peer gives no clock. Each answer is read up to
    ``MAX_HEALTHZ_BYTES`` (BadAnswer past it); the caller's deadline bounds the time."""
    best: tuple[float | None, float] | None = None
    for _ in range(CLOCK_SAMPLES):
        t0 = clock()
        try:
            status, data = await read_capped(client, "GET", f"{url}{HEALTHZ_PATH}", max_bytes=MAX_HEALTHZ_BYTES)
            t3 = clock()
            peer = response_json(data).get("clock") if status in (200, 503) else None
        except BadAnswer as exc:
            if str(exc).startswith("not JSON"):
                return (best[0], best[1]) if best else (None, None)
            raise BadAnswer(f"/healthz: {exc}") from None
        except (httpx.HTTPError, AttributeError):
            return (best[0], best[1]) if best else (None, None)
        offset, delay = clock_offset(t0, peer, peer, t3)
        if offset is not None and (best is None or delay < best[1]):
            best = (offset, delay)
    return (best[0], best[1]) if best else (None, None)


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def clock_offset(t0: float, t1: Any, t2: Any, t3: float) -> tuple[float | None, float]:
    """NTP's estimate (RFC 5905): we sent at t0, the peer received at t1 and answered at t2, we got it at t3.

    offset = ((t1 - t0) + (t2 - t3)) / 2, the peer's clock minus ours; the round trip less the peer's own time is
    the delay, and the offset is good to half of it. (None, delay) when the peer's times are not numbers."""
    a, b = _number(t1), _number(t2)
    if a is None or b is None or b < a:
        return None, round(t3 - t0, 6)
    return round(((a - t0) + (b - t3)) / 2, 6), round(max((t3 - t0) - (b - a), 0.0), 6)


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 6)


async def ask_peers(
    client: httpx.AsyncClient, urls: Sequence[str], token: str | None, budget_s: float, cached: bool
) -> list[NodeRun]:
    """Every peer by ``budget_s`` from now, whatever their number: one deadline for all (a peer that waits for a
    free slot of the ``MAX_PARALLEL_FETCHES`` has that much less of it), not ``budget_s`` each."""
    until = time.monotonic() + budget_s
    return await in_parallel(
        urls, lambda url: ask_peer(client, url, token, budget_s, cached, until=until), MAX_PARALLEL_FETCHES
    )


def assemble(local: NodeRun, peers: Sequence[NodeRun], tolerances: Mapping[str, float] | None = None,
             deadline_s: float | None = None) -> ClusterView:  # fmt: skip
    """This node and its peers, names made unique, compared (``fleet.compare``) over those that answered."""
    seen: set[str] = {local.node}
    nodes = [local]
    for run in peers:
        if run.node in seen:  # two peers (or a peer and us) with one name: keep both, told apart by address
            run = replace(run, node=f"{run.node}@{peer_label(run.url or '')}", doc=_renamed(run))
        seen.add(run.node)
        nodes.append(run)
    snapshots = [validate(ResultsDocument, n.doc).compared() | {"node": n.node} for n in nodes if n.doc]
    outcome = compare(snapshots, tolerances)
    return ClusterView(tuple(nodes), outcome, deadline_s)


def _renamed(run: NodeRun) -> dict[str, Any] | None:
    return None if run.doc is None else {**run.doc, "node": f"{run.node}@{peer_label(run.url or '')}"}


def cluster_document(view: ClusterView) -> dict[str, Any]:
    """``check --cluster --json``: every node's results document and the comparison, one status."""
    return {
        "status": view.status.value,
        "deadline_s": view.deadline_s,
        "nodes": [
            {
                "node": n.node,
                "url": n.url,
                "local": n.url is None,
                "status": n.status.value,
                "error": n.error,
                "seconds": n.seconds,
                "cached": n.cached,
                "source": n.source,
                "clock_offset_s": n.clock_offset_s,
                "rtt_s": n.rtt_s,
                "results": n.doc,
            }
            for n in view.nodes
        ],
        "comparison": {
            "nodes": list(view.comparison.nodes),
            "compared_facts": view.comparison.compared_facts,
            "findings": [FindingDoc.of(f).dumped() for f in view.comparison.findings],
            "imbalances": [
                {
                    "metric": i.key,
                    "rail": i.rail,
                    "group": i.group,
                    "ratio": round(i.ratio, 6),
                    "values": dict(i.values),
                }
                for i in view.comparison.imbalances
            ],
            # A fact the nodes disagree on: every node's value; "odd" only where a majority of 3+ nodes agree.
            "drifts": [{"fact": d.key, "values": dict(d.values), "odd": list(d.odd)} for d in view.comparison.drifts],
        },
    }

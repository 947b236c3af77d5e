"""``dgxdoctor check --cluster``: this node's checks and every peer's, at the same time, under one deadline.

The local checks and the peers' runs (``POST /check/run``, or ``GET /state`` with ``--cached``) go in parallel,
so the wall time is that of the slowest node plus a round trip, not the sum. Each node's checks are held to the
deadline; a peer that has not answered by then is UNKNOWN, named, and the run ends on time.
"""

from __future__ import annotations

import asyncio
import time

from dgxdoctor import eventlog
from dgxdoctor.checks.base import Check, CheckRunner, capped
from dgxdoctor.checks.peer_compare import PeerCompareSettings
from dgxdoctor.config import Config
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.fleet.cluster import ClusterView, NodeRun, ask_peers, assemble
from dgxdoctor.fleet.discovery import Membership, discover
from dgxdoctor.fleet.prom_view import GONE_WINDOW, PrometheusUnavailable, ViewNode, fetch_view
from dgxdoctor.validation import validate

log = eventlog.get_logger(__name__)

# Past the slowest check's own timeout: time for the peer to answer and the results to travel.
DEADLINE_MARGIN_S = 5.0
# An interactive command answers in seconds. A check's timeout_s is its worst case, not what it takes: the default
# checks finish in a second or two, so the run is held to this and a check still running then is UNKNOWN (timed out).
CLUSTER_DEADLINE_S = 15.0
# --cached reads the peers' latest results (GET /state, no run on the peer): a round trip, not a run of checks.
CACHED_DEADLINE_S = 5.0
# Asked for by name (--only), a slow check gets its own timeout plus the margin, up to this: the weekly bench
# (1800 s) and the NCCL probe (600 s) are beyond what an operator waits for; `--only nccl --deadline 600` asks for one.
DEFAULT_DEADLINE_MAX_S = 120.0


def default_deadline(checks: list[Check], named: bool = False, cached: bool = False) -> float:
    """``CLUSTER_DEADLINE_S`` (``CACHED_DEADLINE_S`` with ``cached``); when the checks were ``named`` with
    ``--only`` and one of them needs longer than that, the slowest one's timeout plus the margin, at most
    ``DEFAULT_DEADLINE_MAX_S``."""
    usual = CACHED_DEADLINE_S if cached else CLUSTER_DEADLINE_S
    if not named or not checks:
        return usual
    needed = max(c.settings.timeout_s for c in checks) + DEADLINE_MARGIN_S
    return min(needed, DEFAULT_DEADLINE_MAX_S) if needed > CLUSTER_DEADLINE_S else usual


def tolerances(config: Config) -> dict[str, float]:
    return dict(config.settings_of("peer_compare", PeerCompareSettings).tolerances)


async def _run(
    config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool,
    peers: list[str] | None = None,
) -> ClusterView:  # fmt: skip
    env = config.environment()
    if peers is None:
        found, _ = discover(Membership(), config.peer_sources(), config.own_agent(), env.http_client)
        peers = list(found)
    urls = peers
    runner = CheckRunner(env)
    t0 = time.monotonic()

    async def local() -> NodeRun:
        results = await runner.run_once(checks)
        doc = ResultsDocument.of(env.node, results, env.clock(), env.group).state()
        return NodeRun(env.node, None, doc, None, round(time.monotonic() - t0, 6), 0.0, 0.0)

    async with env.async_http_client(deadline_s, peer=True) as client:
        mine, runs = await asyncio.gather(local(), ask_peers(client, urls, token, deadline_s, cached))
    return assemble(mine, runs, tolerances(config), deadline_s)


async def _run_with_prometheus(
    config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool
) -> ClusterView:
    """``[fleet] prometheus_url``: the nodes Prometheus scrapes. ``cached``: their statuses, codes and subjects from
    one query, and the messages of the nodes that are not OK from their own ``/state``, all within the deadline.
    Fresh: every node Prometheus knows (and ``[daemon] peers``) asked to run now, 8 at a time."""
    env = config.environment()
    fleet = config.fleet
    url = fleet.prometheus_url
    assert url is not None
    t0 = time.monotonic()
    async with env.async_http_client(fleet.prometheus_timeout_s) as prom:
        try:
            view = await fetch_view(prom, url, fleet.job, min(fleet.prometheus_timeout_s, deadline_s))
        except PrometheusUnavailable as exc:
            if not config.daemon.peers:
                return ClusterView((NodeRun("prometheus", url, None, str(exc)),), deadline_s=deadline_s)
            log.warning("prometheus_unavailable", error=str(exc), fallback="[daemon] peers")
            return await _run(config, checks, token, deadline_s, cached)
    scheme = "https" if config.daemon.tls_cert_file is not None else "http"
    urls = {n.node: f"{scheme}://{n.instance}" for n in view.nodes if n.instance}
    left = deadline_s - (time.monotonic() - t0)
    if not cached:
        others = [u for node, u in urls.items() if node != env.node]
        peers = list(dict.fromkeys([*config.daemon.peers, *others]))
        return await _run(config, checks, token, left, cached, peers)
    not_ok = [urls[n.node] for n in view.nodes if n.doc and n.doc["status"] not in QUIET and n.node in urls]
    async with env.async_http_client(deadline_s, peer=True) as client:
        fetched = {run.url: run for run in await ask_peers(client, not_ok, token, left, cached=True)}
    return ClusterView(tuple(_from_view(n, urls.get(n.node), fetched) for n in view.nodes), view.comparison,
                       deadline_s)  # fmt: skip


# Statuses whose node's /state is not read for messages: nothing to explain.
QUIET = ("ok", "skipped")


def _from_view(node: ViewNode, url: str | None, fetched: dict[str | None, NodeRun]) -> NodeRun:
    """A node of the Prometheus view: its own /state when it came (messages), else what Prometheus has."""
    if node.doc is None:
        gone = f"not scraped by Prometheus now (seen within the last {GONE_WINDOW}): its agent or the node is down"
        return NodeRun(node.node, url, None, gone, cached=True, source="prometheus")
    run = fetched.get(url)
    if run is not None and run.doc is not None and run.node == node.node:
        return run
    doc = validate(ResultsDocument, node.doc).state()
    why = None if run is None else f"messages not read: {run.error or 'another node answered'}"
    return NodeRun(node.node, url, doc, why, cached=True, source="prometheus")


def run_cluster_check(
    config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool
) -> ClusterView:
    """Every node's results and their comparison; local checks capped at the deadline like the peers' are. With
    ``[fleet] prometheus_url``, the nodes are those Prometheus scrapes (``_run_with_prometheus``)."""
    # peer_compare is the daemon's; here the comparison is of the results just gathered (fleet.compare).
    bounded = [_with_settings(c, deadline_s) for c in checks if c.name != "peer_compare"]
    run = _run_with_prometheus if config.fleet.prometheus_url is not None else _run
    # Not asyncio.run: it waits at the end for every helper thread of the loop (a DNS lookup that hangs); closing
    # the loop leaves them, so the deadline holds for the command, not only for the exchanges.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run(config, bounded, token, deadline_s, cached))
    finally:
        loop.close()


def _with_settings(check: Check, deadline_s: float) -> Check:
    if check.settings.timeout_s <= deadline_s:
        return check
    check.settings = capped(check.settings, deadline_s)  # the runner reads the timeout from here
    return check

"""``dgxdoctor check --cluster``: this node's checks and every peer's, at the same time, under one deadline.

The local checks and the peers' runs (``POST /check/run``, or ``GET /state`` with ``--cached``) go in parallel,
so the wall time is that of the slowest node plus a round trip, not the sum. Each node's checks are held to the
deadline; a peer that has not answered by then is UNKNOWN, named, and the run ends on time.
"""

from __future__ import annotations

import asyncio
import time

from dgxdoctor.checks.base import Check, CheckRunner, capped
from dgxdoctor.checks.peer_compare import PeerCompareSettings
from dgxdoctor.config import Config
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.fleet.cluster import ClusterView, NodeRun, ask_peers, assemble

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


async def _run(config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool) -> ClusterView:
    env = config.environment()
    runner = CheckRunner(env)
    t0 = time.monotonic()

    async def local() -> NodeRun:
        results = await runner.run_once(checks)
        doc = ResultsDocument.of(env.node, results, env.clock(), env.group).state()
        return NodeRun(env.node, None, doc, None, round(time.monotonic() - t0, 6), 0.0, 0.0)

    async with env.async_http_client(deadline_s, peer=True) as client:
        mine, peers = await asyncio.gather(local(), ask_peers(client, config.daemon.peers, token, deadline_s, cached))
    return assemble(mine, peers, tolerances(config), deadline_s)


def run_cluster_check(
    config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool
) -> ClusterView:
    """Every node's results and their comparison; local checks capped at the deadline like the peers' are."""
    # peer_compare is the daemon's; here the comparison is of the results just gathered (fleet.compare).
    bounded = [_with_settings(c, deadline_s) for c in checks if c.name != "peer_compare"]
    # Not asyncio.run: it waits at the end for every helper thread of the loop (a DNS lookup that hangs); closing
    # the loop leaves them, so the deadline holds for the command, not only for the exchanges.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_run(config, bounded, token, deadline_s, cached))
    finally:
        loop.close()


def _with_settings(check: Check, deadline_s: float) -> Check:
    if check.settings.timeout_s <= deadline_s:
        return check
    check.settings = capped(check.settings, deadline_s)  # the runner reads the timeout from here
    return check

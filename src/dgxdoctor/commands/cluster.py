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
# The default never waits longer than this: the weekly bench (1800 s) and the NCCL probe (600 s) have timeouts far
# beyond what an operator waits for in a terminal; `--only nccl --deadline 600` asks for one.
DEFAULT_DEADLINE_MAX_S = 120.0


def default_deadline(checks: list[Check]) -> float:
    """The slowest enabled check's timeout plus a margin (what a single node's `check` waits), within bounds."""
    slowest = max([c.settings.timeout_s for c in checks] + [10.0])
    return min(slowest + DEADLINE_MARGIN_S, DEFAULT_DEADLINE_MAX_S)


def tolerances(config: Config) -> dict[str, float]:
    return dict(config.settings_of("peer_compare", PeerCompareSettings).tolerances)


async def _run(config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool) -> ClusterView:
    env = config.environment()
    runner = CheckRunner(env)
    t0 = time.monotonic()

    async def local() -> NodeRun:
        results = await runner.run_once(checks)
        doc = ResultsDocument.of(env.node, results, env.clock()).state()
        return NodeRun(env.node, None, doc, None, round(time.monotonic() - t0, 6), 0.0, 0.0)

    async with env.async_http_client(deadline_s) as client:
        mine, peers = await asyncio.gather(local(), ask_peers(client, config.daemon.peers, token, deadline_s, cached))
    return assemble(mine, peers, tolerances(config), deadline_s)


def run_cluster_check(
    config: Config, checks: list[Check], token: str | None, deadline_s: float, cached: bool
) -> ClusterView:
    """Every node's results and their comparison; local checks capped at the deadline like the peers' are."""
    # peer_compare is the daemon's; here the comparison is of the results just gathered (fleet.compare).
    bounded = [_with_settings(c, deadline_s) for c in checks if c.name != "peer_compare"]
    return asyncio.run(_run(config, bounded, token, deadline_s, cached))


def _with_settings(check: Check, deadline_s: float) -> Check:
    if check.settings.timeout_s <= deadline_s:
        return check
    check.settings = capped(check.settings, deadline_s)  # the runner reads the timeout from here
    return check

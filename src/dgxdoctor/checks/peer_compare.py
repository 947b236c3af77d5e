"""peer_compare: read every peer's ``/state`` and compare it with this node's latest results.

By hand: ``curl -H "Authorization: Bearer $TOKEN" http://dgx-b:9835/state | jq '.facts, .checks[].samples'``
on both nodes, and ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv`` side by side.

Where the local snapshot comes from: ``env.fleet``, the seam the daemon fills (``environment.Fleet``). Its
``local_state(name)`` is the result store's ``/state`` document without this check's own result, so the
comparison sees exactly what peers see of us; ``peers()`` gives the peers, the token and the per-peer timeout
of the ``[daemon]`` table; ``record_peers`` keeps what was fetched for the status page, which asks no peer itself.
Outside the daemon (``dgxdoctor check``) there is no store and the check is SKIPPED.

A peer of another release is compared like any other (documents.py reads the previous release's documents and a
newer schema's known keys): the release difference is one PEER_VERSION_SKEW warning of the comparison, and a newer
schema is said in this check's fact ``peer_schema.<peer>``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

from msgspec import Meta, field
from msgspec.structs import replace

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment, Peers
from dgxdoctor.fleet.compare import PEER_VIEW_FACT, RULE_KEYS, Imbalance, compare, group_of
from dgxdoctor.fleet.discovery import Round
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Sample
from dgxdoctor.settings.bounds import DAY_S

PEER_UP = MetricSpec(
    "dgxdoctor_peer_up",
    "1 if the peer's dgxdoctor answered /state with a valid document in this cycle, else 0",
    labels=("peer",),
)
PEER_FETCH_SECONDS = MetricSpec(
    "dgxdoctor_peer_fetch_duration_seconds",
    "seconds the last /state request to the peer took (until the answer or the timeout)",
    labels=("peer",),
)
PEER_IMBALANCE = MetricSpec(
    "dgxdoctor_peer_imbalance_ratio",
    "(max - min) / max of a compared metric over this node and its peers: 0 balanced, 1 one node idle; "
    "rail is device/port for per-rail IB metrics, empty for node-wide ones",
    labels=("metric", "rail"),
)


class PeerCompareSettings(CheckSettings, frozen=True):
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between comparisons")] = 15.0
    timeout_s: Annotated[
        float,
        Meta(gt=0, le=DAY_S, description="a comparison that takes longer is UNKNOWN (peers are fetched 8 at a time)"),
    ] = 30.0
    tolerances: Annotated[
        dict[str, Annotated[float, Meta(gt=0, le=1)]],
        Meta(
            description="imbalance tolerated per compared metric before a finding, in (0, 1], e.g. "
            "{gpu_utilization = 0.3}; "
            f"keys: {', '.join(sorted(RULE_KEYS))}"
        ),
    ] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.tolerances) - RULE_KEYS)
        if unknown:
            raise ValueError(f"tolerances: unknown metric(s) {unknown}; known: {sorted(RULE_KEYS)}")


class PeerCompareCheck(Check[PeerCompareSettings]):
    name: ClassVar[str] = "peer_compare"
    probes: ClassVar[tuple[str, ...]] = ("peer",)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self.tolerances = self.settings.tolerances
        # Per peer URL, the hardware causes its last answer relayed. A peer that gives no state (its agent
        # restarting, the node rebooting) has causes unknown, not none: they stay until it answers again, so this
        # node's remediation does not restart the group under a GPU that is still off the bus.
        self._causes: dict[str, tuple[Finding, ...]] = {}

    def _not_here(self, peers: Peers) -> CheckResult | None:
        if peers.prometheus_url is not None:
            return CheckResult.skipped(
                self.name,
                f"the comparison runs in Prometheus ([fleet] prometheus_url = {peers.prometheus_url}): "
                "the shipped rules compare the nodes of each serving group, no peer's /state is fetched",
            )
        if not peers.urls:
            return CheckResult.skipped(self.name, "no peers configured ([daemon] peers)")
        return None

    def run(self) -> CheckResult:
        fleet = self.env.fleet
        if fleet is None:
            return CheckResult.skipped(self.name, "compares nodes inside the daemon (dgxdoctor run) only")
        # The fetch (httpx) and the peer verdicts load with the daemon's first comparison, not with `check`.
        from dgxdoctor.fleet.peers import fetch_all
        from dgxdoctor.judge.hardware_cause import peer_cause_findings
        from dgxdoctor.judge.peers import peer_name_clash, peer_unreachable

        peers = fleet.peers()
        skipped = self._not_here(peers)
        if skipped is not None:
            return skipped
        builder = ResultBuilder(self.name)
        builder.add(*peers.findings)  # what discovering them found: a source kept stale, a node that left Ray
        local = fleet.local_state(self.name)
        snapshots = [local]
        down = 0
        # Peers are fetched in parallel, each under a hard deadline of timeout_s for the whole exchange.
        fetched = fetch_all(
            lambda: self.env.async_http_client(peers.timeout_s, peer=True), peers.urls, peers.token, peers.timeout_s
        )
        fetched_at = self.env.clock()
        fleet.record_peers(fetched)  # the status page shows these; it asks no peer itself
        for url, got in zip(peers.urls, fetched, strict=True):
            builder.sample(PEER_UP, 1.0 if got.up else 0.0, peer=got.label)
            builder.sample(PEER_FETCH_SECONDS, got.seconds, peer=got.label)
            if got.state is None:
                down += 1
                if got.timed_out:
                    builder.timed_out("peer")
                builder.add(peer_unreachable(url, str(got.error), got.label))
                kept = f"{got.label} gave no state now ({str(got.error)[:100]}): its last answer's cause, kept"
                builder.add(*(replace(f, evidence=kept) for f in self._causes.get(url, ())))
                continue
            state = got.state
            newer = got.document.newer_schema() if got.document is not None else None
            if newer:  # read for what this release knows; said, not a finding
                builder.facts[f"{PEER_VIEW_FACT}{got.label}"] = newer
            if any(s["node"] == state["node"] for s in snapshots):
                builder.add(peer_name_clash(url, str(state["node"]), got.label))
                state = {**state, "node": f"{state['node']}@{got.label}"}
            snapshots.append(state)
            relayed = tuple(peer_cause_findings(state, got.label))
            self._causes[url] = relayed
            builder.add(*relayed)
        outcome = compare(snapshots, self.tolerances)
        builder.samples.extend(imbalance_samples(outcome.imbalances, group_of(local)))
        builder.add(*outcome.findings)
        up = len(peers.urls) - down
        _date_relayed(builder, snapshots, fetched_at)
        summary = (
            f"{up}/{len(peers.urls)} peer(s) answered; {len(outcome.imbalances)} metric(s) and "
            f"{outcome.compared_facts} fact(s) compared, {len(outcome.findings)} difference(s)"
        )
        return builder.build(summary)


def _date_relayed(builder: ResultBuilder, snapshots: list[dict[str, Any]], fetched_at: float) -> None:
    """A finding relaying a peer's result is as old as that result (remediation acts on no evidence from before its
    last action: a worker's check that has not run since the restart still says what it saw before)."""
    from dgxdoctor.fleet.compare import relayed_age

    for i, f in enumerate(builder.findings):
        age = relayed_age(f, snapshots)
        if age is not None:
            builder.findings[i] = replace(f, seen_at=fetched_at - age)


def imbalance_samples(imbalances: Iterable[Imbalance], group: str) -> list[Sample]:
    """``dgxdoctor_peer_imbalance_ratio`` of this node's own serving group (another group's, and the one between the
    groups, are for their own nodes and the rules)."""
    return [
        Sample(PEER_IMBALANCE, i.ratio, {"metric": i.key, "rail": i.rail}) for i in imbalances if i.group in ("", group)
    ]


def discovery_findings(seen: Round) -> tuple[Finding, ...]:
    """What discovering the peers saw (``fleet.discovery.Round``), judged: a source kept stale, a node that left
    Ray, more peers than are compared."""
    from dgxdoctor.judge.peers import discovery_source_failed, peer_left_ray, peers_capped

    found = [discovery_source_failed(source, error, kept) for source, error, kept in seen.stale]
    found += [peer_left_ray(ip, state, message) for ip, state, message in seen.left_ray]
    if seen.capped is not None:
        found.append(peers_capped(*seen.capped))
    return tuple(found)

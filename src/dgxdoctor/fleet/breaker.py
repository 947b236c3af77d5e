"""The fleet breaker's verdict: is more than a fraction of the fleet's nodes or serving groups unhealthy at once?

When a fabric fault or a bad driver rollout hits many nodes together, restarts cannot help and would multiply the
outage: remediation stops acting and pages instead (``remediation.fleet_gate``). The rule applies only to a fleet
large enough for a fraction to mean something: at least ``min_nodes`` nodes (counted by nodes) or ``min_groups``
groups (counted by groups), as EKS applies its 20 % rule only above five nodes. On the base two-node deployment one
fault is half the fleet, and the breaker must never stop an action there.

The input is a list of ``Member`` (node, group, healthy) tuples, whatever the cluster view: today the daemon's own
results and the peers' latest ``/state`` it already holds (``members_from_states``), or with Prometheus as the
cluster view the nodes Prometheus scrapes (``fleet.prom_fleet``), which also says what it could not read
(``FleetReading``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from msgspec import Struct

if TYPE_CHECKING:
    from dgxdoctor.fleet.peer_states import PeerState

# One unhealthy node or group is that node's or group's fault, never the fleet's: the breaker needs at least this
# many at once (so on three groups one stuck group is restarted, two trip it: 67 % > 20 %).
MIN_UNHEALTHY = 2


# The fact that names a node's serving group in its results document (``[node] group`` once the node declares it).
class Member(Struct, frozen=True):
    """One node of the fleet as the cluster view sees it. ``group``: its serving group; None: none declared."""

    node: str
    group: str | None
    healthy: bool


class FleetReading(Struct, frozen=True):
    """The members a view could read, and ``unknown``: why part of the fleet could not be read ("" when all was).
    The breaker counts only what is known, and the audit says what was not."""

    members: tuple[Member, ...]
    unknown: str = ""


# The cluster view's one duty towards the breaker: the fleet's members now (or a FleetReading that says what of the
# fleet it could not read: fleet.prom_fleet).
FleetView = Callable[[], Sequence[Member] | FleetReading]


class FleetHealth(Struct, frozen=True):
    nodes: int
    bad_nodes: tuple[str, ...]
    groups: int
    bad_groups: tuple[str, ...]
    tripped: bool
    reason: str  # why it tripped ("" when it did not)
    unknown: str = ""  # what of the fleet the view could not read ("" when it read all)


def _over(bad: int, total: int, max_fraction: float) -> bool:
    return bad >= MIN_UNHEALTHY and bad > max_fraction * total


def _share(bad: int, total: int) -> str:
    return f"{bad} of {total} ({100 * bad / total:.0f} %)"


def fleet_health(
    members: Iterable[Member], max_fraction: float, min_nodes: int, min_groups: int, unknown: str = ""
) -> FleetHealth:
    """Trips when more than ``max_fraction`` of the nodes (a fleet of ``min_nodes`` or more) or of the groups
    (``min_groups`` or more) is unhealthy, and at least ``MIN_UNHEALTHY`` of them. A group is unhealthy when one of
    its nodes is. A node listed twice counts once, unhealthy if either says so. ``unknown``: what the view could
    not read (counted as nothing, carried into the verdict so the audit says it)."""
    healthy: dict[str, bool] = {}
    group_of: dict[str, str] = {}
    for m in members:
        healthy[m.node] = healthy.get(m.node, True) and m.healthy
        if m.group:
            group_of[m.node] = m.group
    bad_nodes = tuple(sorted(n for n, ok in healthy.items() if not ok))
    groups = set(group_of.values())
    bad_groups = tuple(sorted({group_of[n] for n in bad_nodes if n in group_of}))
    why = []
    if len(healthy) >= min_nodes and _over(len(bad_nodes), len(healthy), max_fraction):
        why.append(f"{_share(len(bad_nodes), len(healthy))} nodes unhealthy: {', '.join(bad_nodes[:8])}")
    if len(groups) >= min_groups and _over(len(bad_groups), len(groups), max_fraction):
        why.append(f"{_share(len(bad_groups), len(groups))} groups unhealthy: {', '.join(bad_groups[:8])}")
    reason = "; ".join(why) + (f", more than {100 * max_fraction:g} % at once" if why else "")
    if why and unknown:
        reason += f" ({unknown})"
    return FleetHealth(len(healthy), bad_nodes, len(groups), bad_groups, bool(why), reason, unknown)


def members_from_states(node: str, group: str, status: str, peers: Iterable[PeerState]) -> list[Member]:
    """This node (its ``[node] group`` and overall ``status``) and every peer as last fetched (a peer's document of a
    release before groups names none: None): a peer is unhealthy when its
    results are CRITICAL or when it gave none (unreachable, refused, invalid: a node that cannot answer is no
    healthy node). UNKNOWN or WARNING results are not counted as unhealthy: the breaker counts faults."""
    out = [Member(node, group, status != "critical")]
    for peer in peers:
        doc = peer.document
        if doc is None:
            out.append(Member(peer.label, None, False))
        else:
            out.append(Member(doc.node, doc.group, doc.status != "critical"))
    return out

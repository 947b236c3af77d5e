"""``[fleet]``: where the cluster view comes from past a handful of nodes (docs/fleet.md).

Without ``prometheus_url`` the agents are the cluster view themselves: each fetches its peers' ``/state`` (the
mesh, right for two to four nodes with nothing else around). With it, the Prometheus that scrapes every agent is
the view: ``check --cluster --cached`` asks it in one query, the peer comparison runs there as the shipped rules,
and the agents stop fetching each other's ``/state``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from dgxdoctor.settings.base import Frozen
from dgxdoctor.validation import Host, HttpUrl

PeerSource = Literal["static", "ray", "prometheus", "dns"]

DEFAULT_JOB = "dgxdoctor"


class FleetSettings(Frozen, frozen=True):
    """The cluster view: the agents' own mesh (default) or the Prometheus that scrapes them."""

    prometheus_url: Annotated[
        HttpUrl | None,
        Meta(
            description="the Prometheus that scrapes every node's dgxdoctor with the shipped rules loaded, e.g. "
            "http://prometheus:9090: `check --cluster --cached` is answered by it in one query, the peer comparison "
            "runs there (the shipped rules, by serving group) and the agents stop fetching each other's /state. "
            "Unset: the agents' mesh ([daemon] peers)",
            examples=["http://prometheus:9090"],
        ),
    ] = None
    prometheus_timeout_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds one query to prometheus_url may take, connect to last byte")
    ] = 2.0
    job: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$",
            description="the Prometheus scrape job of the dgxdoctor agents (its `up` series name the agents down)",
        ),
    ] = DEFAULT_JOB
    peer_sources: Annotated[
        tuple[PeerSource, ...],
        Meta(
            max_length=4,
            description='where the peers come from: "static" ([daemon] peers), "ray" (Ray\'s node table, from '
            '[checks.ray] dashboard_url), "prometheus" (prometheus_url\'s targets of job), "dns" (every address of '
            "dns_name). A source that fails keeps its last known members; a node that leaves the Ray cluster stays a "
            'peer, with a PEER_LEFT_RAY finding (docs/fleet.md, "Peer discovery")',
            examples=[["static", "ray"]],
        ),
    ] = ("static",)
    dns_name: Annotated[
        Host | None, Meta(description='with peer_sources "dns": a name whose addresses are the nodes')
    ] = None
    agent_port: Annotated[
        int, Meta(ge=1, le=65535, description="the port of the agents at the addresses Ray and DNS give")
    ] = 9835
    agent_scheme: Annotated[
        Literal["http", "https"], Meta(description="the scheme of the agents at the addresses Ray and DNS give")
    ] = "http"

    def __post_init__(self) -> None:
        if len(set(self.peer_sources)) != len(self.peer_sources):
            raise ValueError("peer_sources: a source is listed twice")
        if "dns" in self.peer_sources and self.dns_name is None:
            raise ValueError('peer_sources "dns" needs dns_name')
        if "prometheus" in self.peer_sources and self.prometheus_url is None:
            raise ValueError('peer_sources "prometheus" needs prometheus_url')

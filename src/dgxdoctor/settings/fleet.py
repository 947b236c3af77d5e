"""``[fleet]``: where the cluster view comes from past a handful of nodes (docs/fleet.md).

Without ``prometheus_url`` the agents are the cluster view themselves: each fetches its peers' ``/state`` (the
mesh, right for two to four nodes with nothing else around). With it, the Prometheus that scrapes every agent is
the view: ``check --cluster --cached`` asks it in one query, the peer comparison runs there as the shipped rules,
and the agents stop fetching each other's ``/state``.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from dgxdoctor.settings.base import Frozen
from dgxdoctor.sources.fields import HttpUrl

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

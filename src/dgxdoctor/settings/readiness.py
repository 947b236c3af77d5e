"""``[readiness]``: the signal a load balancer (or Kubernetes) uses to send this node traffic or not.

``GET /ready`` on the daemon's listener answers 200 or 503 with one word; HAProxy's agent-check protocol answers on
``agent_listen`` (off unless set). Hysteresis: after being out of rotation, the node comes back only after
``ready_after_good`` good evaluations (vllm check runs) in a row.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bounds import HOUR_S
from dgxdoctor.settings.daemon import parse_listen


class ReadinessSettings(Frozen, frozen=True):
    """Readiness: whether this node's serving group is fit for traffic (docs/remediation.md, "Out of rotation")."""

    ready_after_good: Annotated[
        int,
        Meta(ge=1, le=100, description="good evaluations (vllm check runs) in a row before the node is ready again"),
    ] = 2
    suspect_after_s: Annotated[
        float,
        Meta(
            gt=0,
            le=HOUR_S,
            description="requests waiting or running while the engine made no progress this long: out of rotation "
            "(suspect) without a restart, back when progress resumes",
        ),
    ] = 5.0
    recheck_s: Annotated[
        float,
        Meta(
            gt=0,
            le=HOUR_S,
            description="while out of rotation (not in a restart), the vllm check runs at least this often, so the "
            "node returns as soon as it is fit",
        ),
    ] = 2.0
    agent_listen: Annotated[
        str | None,
        Meta(
            description="HOST:PORT of HAProxy's agent-check (`server ... agent-check agent-port PORT`): one line, "
            "up/drain/down/maint; unset: off"
        ),
    ] = None

    def __post_init__(self) -> None:
        """The agent's listen address (msgspec reports a ValueError here at ``$.readiness``)."""
        if self.agent_listen is not None:
            try:
                parse_listen(self.agent_listen)
            except ValueError as exc:
                raise ValueError(f"agent_listen: {exc}") from None

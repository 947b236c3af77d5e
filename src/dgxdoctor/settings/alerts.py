"""``[alerts]``: where the daemon posts a page."""

from __future__ import annotations

from pydantic import Field

from dgxdoctor.settings.base import Frozen
from dgxdoctor.sources.fields import HttpUrl


class AlertsSettings(Frozen):
    """Alerts out: where the daemon posts a page when remediation's ladder ends at "page"."""

    alertmanager_url: HttpUrl | None = Field(
        None, description="Alertmanager base URL (its v2 API), e.g. http://alertmanager:9093; unset: log pages only"
    )
    timeout_s: float = Field(5.0, gt=0, le=60, description="timeout of one post to Alertmanager")

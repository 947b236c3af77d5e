"""``[alerts]``: where the daemon posts a page."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from dgxdoctor.settings.base import Frozen
from dgxdoctor.validation import HttpUrl


class AlertsSettings(Frozen, frozen=True):
    """Alerts out: where the daemon posts a page when remediation's ladder ends at "page"."""

    alertmanager_url: Annotated[
        HttpUrl | None,
        Meta(description="Alertmanager base URL (its v2 API), e.g. http://alertmanager:9093; unset: log pages only"),
    ] = None
    timeout_s: Annotated[float, Meta(gt=0, le=60, description="timeout of one post to Alertmanager")] = 5.0

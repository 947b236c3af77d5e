"""Every check, in display order. Explicit: adding a check is one line here, no import-time magic."""

from __future__ import annotations

from dgxdoctor.checks.base import CheckFactory
from dgxdoctor.checks.infiniband import InfinibandCheck
from dgxdoctor.checks.peer_compare import PeerCompareCheck

ALL_CHECKS: tuple[CheckFactory, ...] = (InfinibandCheck, PeerCompareCheck)


def by_name() -> dict[str, CheckFactory]:
    return {factory.name: factory for factory in ALL_CHECKS}

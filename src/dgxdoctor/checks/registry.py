"""Every check, in display order. Explicit: adding a check is one line here, no import-time magic."""

from __future__ import annotations

from dgxdoctor.checks.base import CheckFactory
from dgxdoctor.checks.gpu import GpuCheck
from dgxdoctor.checks.infiniband import InfinibandCheck
from dgxdoctor.checks.peer_compare import PeerCompareCheck
from dgxdoctor.checks.xid import XidCheck

# peer_compare last: it compares the results of the others.
ALL_CHECKS: tuple[CheckFactory, ...] = (GpuCheck, XidCheck, InfinibandCheck, PeerCompareCheck)


def by_name() -> dict[str, CheckFactory]:
    return {factory.name: factory for factory in ALL_CHECKS}

"""Every check, in display order. Explicit: adding a check is one line here, no import-time magic."""

from __future__ import annotations

from dgxdoctor.checks.base import CheckFactory
from dgxdoctor.checks.host import HostCheck
from dgxdoctor.checks.infiniband import InfinibandCheck
from dgxdoctor.checks.nccl_env import NcclEnvCheck
from dgxdoctor.checks.topology import TopologyCheck

ALL_CHECKS: tuple[CheckFactory, ...] = (
    HostCheck,
    TopologyCheck,
    InfinibandCheck,
    NcclEnvCheck,
)


def by_name() -> dict[str, CheckFactory]:
    return {factory.name: factory for factory in ALL_CHECKS}

"""Every check, in display order. Explicit: adding a check is one line here, no import-time magic."""

from __future__ import annotations

from dgxdoctor.checks.base import CheckFactory
from dgxdoctor.checks.bench import BenchCheck
from dgxdoctor.checks.drift import DriftCheck
from dgxdoctor.checks.driver_stack import DriverStackCheck
from dgxdoctor.checks.gpu import GpuCheck
from dgxdoctor.checks.host import HostCheck
from dgxdoctor.checks.infiniband import InfinibandCheck
from dgxdoctor.checks.logs import LogsCheck
from dgxdoctor.checks.mlxlink import MlxlinkCheck
from dgxdoctor.checks.nccl import NcclCheck
from dgxdoctor.checks.nccl_env import NcclEnvCheck
from dgxdoctor.checks.peer_compare import PeerCompareCheck
from dgxdoctor.checks.ras import RasCheck
from dgxdoctor.checks.ray import RayCheck
from dgxdoctor.checks.topology import TopologyCheck
from dgxdoctor.checks.vllm import VllmCheck
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck
from dgxdoctor.checks.xid import XidCheck

ALL_CHECKS: tuple[CheckFactory, ...] = (
    GpuCheck,
    XidCheck,
    DriverStackCheck,
    TopologyCheck,
    InfinibandCheck,
    MlxlinkCheck,
    NcclEnvCheck,
    NcclCheck,
    VllmCheck,
    VllmExecutorCheck,
    RasCheck,
    BenchCheck,
    RayCheck,
    HostCheck,
    LogsCheck,
    DriftCheck,
    PeerCompareCheck,
)

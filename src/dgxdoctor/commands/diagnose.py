"""``dgxdoctor diagnose --config``: the checks' thresholds a pasted section is judged against, typed."""

from __future__ import annotations

from dgxdoctor.checks.infiniband import InfinibandSettings
from dgxdoctor.checks.nccl import NcclSettings
from dgxdoctor.checks.ray import RaySettings
from dgxdoctor.config import Config
from dgxdoctor.diagnose.registry import Thresholds


def thresholds(config: Config) -> Thresholds:
    """[checks.infiniband] min_rate_gbps, [checks.nccl] expected_busbw_gbps and min_fraction, [checks.ray]
    expected_nodes and expected_gpus."""
    ib = config.settings_of("infiniband", InfinibandSettings)
    nccl = config.settings_of("nccl", NcclSettings)
    ray = config.settings_of("ray", RaySettings)
    return Thresholds(
        ib_min_rate_gbps=ib.min_rate_gbps,
        nccl_expected_busbw_gbps=nccl.expected_busbw_gbps,
        nccl_min_fraction=nccl.min_fraction,
        ray_expected_nodes=ray.expected_nodes,
        ray_expected_gpus=ray.expected_gpus,
    )

"""GPU interconnect topology: every GPU pair joined by NVLink, GPU count, GPU-to-NIC proximity.

By hand: ``nvidia-smi topo -m`` (the tutorial's step 2: GPUs must show NV#, not SYS).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.judge.topology import evaluate_topology
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S, HOUR_S
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.topo import gpu_link_summary, parse_topo_matrix

TOPOLOGY_GPUS = MetricSpec("dgxdoctor_topology_gpus", "GPUs listed by nvidia-smi topo -m")
TOPOLOGY_NON_NVLINK_PAIRS = MetricSpec(
    "dgxdoctor_topology_non_nvlink_gpu_pairs",
    "GPU pairs that nvidia-smi topo -m shows connected over PCIe or SMP (SYS/NODE/PHB/PXB/PIX) instead of NVLink",
)


class TopologySettings(CheckSettings, frozen=True):
    interval_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs (topology rarely changes)")
    ] = 300.0
    expected_gpus: Annotated[
        Annotated[int, Meta(ge=1, le=64)] | None,
        Meta(description="GPUs this node must show (8 on a DGX); unset: not compared"),
    ] = None
    require_nvlink: Annotated[
        bool,
        Meta(
            description="every GPU pair must be NVLink (DGX/HGX with NVSwitch): a non-NVLink pair is critical; "
            "false for PCIe servers, where it is a warning"
        ),
    ] = True
    command_timeout_s: Annotated[float, Meta(gt=0, le=HOUR_S, description="seconds nvidia-smi topo -m may take")] = 15.0


class TopologyCheck(Check[TopologySettings]):
    name: ClassVar[str] = "topology"
    probes: ClassVar[tuple[str, ...]] = ("nvidia-smi",)

    def run(self) -> CheckResult:
        try:
            done = self.env.run_command(["nvidia-smi", "topo", "-m"], self.settings.command_timeout_s)
        except CommandNotFound:
            return CheckResult.skipped(self.name, "nvidia-smi not installed: no NVIDIA driver here")
        except CommandTimeout as exc:
            hung = ResultBuilder(self.name)
            hung.timed_out("nvidia-smi")
            hung.add(
                Finding(
                    "TOPOLOGY_NVIDIA_SMI_TIMEOUT",
                    Status.UNKNOWN,
                    f"nvidia-smi timed out: {exc}",
                    remedy="nvidia-smi hangs when the driver is stuck on a GPU (one that fell off the bus): look for "
                    "XID 79 in the kernel log; drain the node and reboot it",
                )
            )
            return hung.build(f"nvidia-smi topo -m timed out after {self.settings.command_timeout_s:g} s")
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"nvidia-smi topo -m exited {done.returncode}: {detail[-1] if detail else 'no output'}")
        topo = parse_topo_matrix(done.stdout)
        builder = ResultBuilder(self.name)
        for finding in evaluate_topology(
            topo, expected_gpus=self.settings.expected_gpus, require_nvlink=self.settings.require_nvlink
        ):
            builder.add(finding)
        non_nvlink = sum(1 for f in builder.findings if f.code == "TOPO_GPU_PAIR_NOT_NVLINK")
        builder.sample(TOPOLOGY_GPUS, len(topo.gpus))
        builder.sample(TOPOLOGY_NON_NVLINK_PAIRS, non_nvlink if len(topo.gpus) > 1 else None)
        links = gpu_link_summary(topo)
        builder.facts["topology.gpu_links"] = links or "none"
        builder.facts["topology.nics"] = ",".join(topo.nic_device(n) for n in topo.nics)
        bad = [f for f in builder.findings if f.status in (Status.WARNING, Status.CRITICAL)]
        if bad:
            summary = f"{len(bad)} topology problem(s): " + "; ".join(f.message for f in bad[:3])
        else:
            summary = f"{len(topo.gpus)} GPUs, GPU-GPU links {links or 'none (one GPU)'}, {len(topo.nics)} NICs"
        return builder.build(summary)

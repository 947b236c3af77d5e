"""GPU topology verdicts over a parsed ``nvidia-smi topo -m`` matrix: NVLink between every GPU pair, links down,
GPU-NIC affinity. Shared by ``checks/topology.py`` and ``diagnose``.
"""

from __future__ import annotations

from collections import Counter

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.topo import PCIE_NEAR, TopoMatrix, nvlinks

# Operator remedies, shared by the check and `dgxdoctor diagnose`.
REMEDY_NOT_NVLINK = (
    "On a DGX/HGX every GPU pair is joined by NVLink through the NVSwitches: check `nvidia-smi nvlink -s` for "
    "inactive links, that nvidia-fabricmanager is running (`systemctl status nvidia-fabricmanager`), and the "
    "kernel log for XIDs; a node in this state is unfit for tensor parallelism - drain it and open a hardware case."
)


REMEDY_DEGRADED = (
    "Some NVLinks of this pair are down: `nvidia-smi nvlink -s -i <gpu>` shows which; reset the GPU when idle or "
    "open a hardware case."
)


REMEDY_GPU_COUNT = (
    "A GPU is missing from the matrix (fallen off the bus, or hidden by CUDA_VISIBLE_DEVICES): compare with "
    "`nvidia-smi -L` and `lspci | grep -i nvidia`, look for XID 79 in the kernel log."
)


def evaluate_topology(
    topo: TopoMatrix, *, expected_gpus: int | None = None, require_nvlink: bool = True
) -> list[Finding]:
    """Findings for a parsed matrix, the same wherever it came from.

    Decision: the deployment is 8-GPU DGX/HGX nodes where NVSwitch joins every GPU pair (NV12 on A100,
    NV18 on H100/H200), so with ``require_nvlink`` any GPU pair over PCIe/SMP (SYS, NODE, PHB, PXB, PIX) is a
    fault and CRITICAL. Without it (a PCIe server on purpose) such pairs are WARNING: it works, slowly.
    When every pair is NVLink but some pairs have fewer links than most (NV12 among NV18), those pairs are
    WARNING: links are down. GPU-to-NIC proximity is reported as OK (informational) findings.
    """
    gpus = [g for g in topo.gpus if g in topo.matrix]
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    counts = {pair: nvlinks(topo.link(*pair)) for pair in pairs}
    return [
        *_gpu_count(topo, expected_gpus),
        *_not_nvlink(topo, counts, require_nvlink),
        *_degraded(topo, counts),
        *_nic_affinity(topo, gpus),
    ]


def _gpu_count(topo: TopoMatrix, expected: int | None) -> list[Finding]:
    if expected is None or len(topo.gpus) == expected:
        return []
    fewer = len(topo.gpus) < expected
    return [
        Finding(
            "TOPO_GPU_COUNT",
            Status.CRITICAL if fewer else Status.WARNING,
            f"the topology matrix lists {len(topo.gpus)} GPUs, {expected} expected",
            "node",
            evidence=" ".join(topo.gpus),
            remedy=REMEDY_GPU_COUNT if fewer else "set expected_gpus to this node's GPU count",
        )
    ]


def _not_nvlink(topo: TopoMatrix, counts: dict[tuple[str, str], int | None], required: bool) -> list[Finding]:
    return [
        Finding(
            "TOPO_GPU_PAIR_NOT_NVLINK",
            Status.CRITICAL if required else Status.WARNING,
            f"{a} and {b} are connected over {topo.link(a, b) or 'absent'}, not NVLink",
            f"{a}-{b}",
            evidence=topo.lines.get(a),
            remedy=REMEDY_NOT_NVLINK,
        )
        for (a, b), links in counts.items()
        if links is None
    ]


def _degraded(topo: TopoMatrix, counts: dict[tuple[str, str], int | None]) -> list[Finding]:
    """Every pair on NVLink, most with the same number of links: the pairs with fewer have links down."""
    link_counts = [c for c in counts.values() if c is not None]
    if not link_counts or len(link_counts) != len(counts) or len(counts) <= 1:
        return []
    usual, seen = Counter(link_counts).most_common(1)[0]
    if seen * 2 <= len(counts):
        return []
    return [
        Finding(
            "TOPO_NVLINK_DEGRADED",
            Status.WARNING,
            f"{a} and {b} share NV{links}, the other pairs NV{usual}",
            f"{a}-{b}",
            evidence=topo.lines.get(a),
            remedy=REMEDY_DEGRADED,
        )
        for (a, b), links in counts.items()
        if links is not None and links < usual
    ]


def _nic_affinity(topo: TopoMatrix, gpus: list[str]) -> list[Finding]:
    findings = []
    for gpu in gpus:
        near = [(topo.link(gpu, nic), nic) for nic in topo.nics]
        close = [(cell, nic) for cell, nic in near if cell in PCIE_NEAR]
        if close:
            listed = ", ".join(f"{_nic_label(topo, nic)} ({cell})" for cell, nic in close)
            message = f"{gpu} is within a PCIe switch of {listed}"
        elif topo.nics:
            message = f"no NIC shares a PCIe switch with {gpu}"
        else:
            continue
        findings.append(Finding("TOPO_GPU_NIC_AFFINITY", Status.OK, message, gpu, evidence=topo.lines.get(gpu)))
    return findings


def _nic_label(topo: TopoMatrix, nic: str) -> str:
    device = topo.nic_device(nic)
    return device if device == nic else f"{device}/{nic}"

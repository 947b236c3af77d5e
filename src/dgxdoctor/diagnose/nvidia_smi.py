"""`dgxdoctor diagnose` for pasted ``nvidia-smi``, ``nvidia-smi -q`` and ``nvidia-smi nvlink -s`` output, judged by
the gpu check's own verdicts (``judge/gpu.py``): ECC, row remapping, clock events, temperature, power, PCIe,
NVLink, the driver's recovery action. Thresholds that only the node's config knows (expected GPU count and model,
the NVLink count) are not applied to a paste."""

from __future__ import annotations

from typing import Any, ClassVar

from msgspec.structs import replace

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.gpu import GpuLimits, gpu_findings, smi_errors, summary
from dgxdoctor.records import asdict
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nvidia_smi import (
    looks_like_nvlink_status,
    looks_like_query,
    looks_like_table,
    parse_nvlink_status,
    parse_query,
    parse_table,
)
from dgxdoctor.sources.nvml import GpuSnapshot

PASTE_LIMITS = GpuLimits(expected_count=0)


def _unparsable(kind: str, what: str) -> Diagnosis:
    finding = Finding(f"{what}_UNPARSABLE", Status.UNKNOWN, f"no GPU found in the {kind} output")
    return Diagnosis(kind, (finding,))


def _data(gpus: list[GpuSnapshot]) -> dict[str, Any]:
    return {"gpus": [{k: v for k, v in asdict(g).items() if v not in (None, {}, ())} for g in gpus]}


class NvidiaSmiQueryAnalyzer:
    kind: ClassVar[str] = "nvidia-smi-q"

    def detect(self, text: str) -> bool:
        return looks_like_query(text)

    def analyze(self, text: str) -> Diagnosis:
        gpus = parse_query(text)
        if not gpus:
            return _unparsable(self.kind, "NVIDIA_SMI_Q")
        findings = [f for g in gpus for f in gpu_findings(g, PASTE_LIMITS)]
        return Diagnosis(self.kind, tuple(findings), _data(gpus), summary=summary(findings, gpus))


class NvidiaSmiTableAnalyzer:
    kind: ClassVar[str] = "nvidia-smi"

    def detect(self, text: str) -> bool:
        return looks_like_table(text)

    def analyze(self, text: str) -> Diagnosis:
        rows = parse_table(text)
        if not rows:
            return _unparsable(self.kind, "NVIDIA_SMI")
        findings = [
            f for r in rows for f in (*smi_errors(r.snapshot, r.errors), *gpu_findings(r.snapshot, PASTE_LIMITS))
        ]
        gpus = [r.snapshot for r in rows]
        return Diagnosis(self.kind, tuple(findings), _data(gpus), summary=summary(findings, gpus))


class NvlinkStatusAnalyzer:
    kind: ClassVar[str] = "nvidia-smi-nvlink"

    def detect(self, text: str) -> bool:
        return looks_like_nvlink_status(text)

    def analyze(self, text: str) -> Diagnosis:
        status = parse_nvlink_status(text)
        if not status:
            return _unparsable(self.kind, "NVLINK_STATUS")
        gpus = [
            replace(
                GpuSnapshot(index=index, name=name, uuid=uuid),
                nvlink_active={link: "inactive" not in shown for link, shown in links.items()},
            )
            for index, (name, uuid, links) in sorted(status.items())
        ]
        # Against the busiest GPU's link count: a GPU with fewer links listed than its peers lost some.
        most = max(len(g.nvlink_active) for g in gpus)
        findings = [f for g in gpus for f in gpu_findings(g, replace(PASTE_LIMITS, expected_nvlinks=most))]
        return Diagnosis(self.kind, tuple(findings), _data(gpus), summary=summary(findings, gpus))

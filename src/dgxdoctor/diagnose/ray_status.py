"""`dgxdoctor diagnose` of pasted `ray status` output (kind ``ray-status``), whole or a fragment.

Without a config, the expected cluster is the tutorial's: 2 nodes, 16 GPUs. "GPU 数只有 8" (8 of 16 GPUs) is
the tutorial's error 5: the worker never joined, or a firewall blocks 6379/8265.
"""

from __future__ import annotations

from typing import ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.ray import DEFAULT_EXPECTED_GPUS, DEFAULT_EXPECTED_NODES, cluster_findings
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.ray_status import RayStatusError, looks_like_ray_status, parse_ray_status


class RayStatusAnalyzer:
    """The ray check's expectations (``diagnose --config``: [checks.ray] expected_nodes, expected_gpus)."""

    kind: ClassVar[str] = "ray-status"

    def __init__(
        self, expected_nodes: int = DEFAULT_EXPECTED_NODES, expected_gpus: int = DEFAULT_EXPECTED_GPUS
    ) -> None:
        self._nodes = expected_nodes
        self._gpus = expected_gpus

    def detect(self, text: str) -> bool:
        return looks_like_ray_status(text)

    def analyze(self, text: str) -> Diagnosis:
        try:
            report = parse_ray_status(text)
        except RayStatusError as exc:
            return Diagnosis(
                self.kind,
                (
                    Finding(
                        "RAY_STATUS_UNPARSED", Status.UNKNOWN, str(exc), remedy="paste the whole `ray status` output"
                    ),
                ),
            )
        view = report.view()
        gpu = report.usage.get("GPU")
        # A fragment without the node section says nothing of the node count: nothing is expected of it.
        expected_nodes = self._nodes if report.nodes_known else 0
        findings = cluster_findings(view, expected_nodes, self._gpus, gpu_evidence=gpu.line if gpu else None)
        data = {
            "timestamp": report.timestamp,
            "nodes_alive": view.nodes_alive,
            "gpus_total": view.gpus_total,
            "gpus_used": view.gpus_used,
            "pending_nodes": list(report.pending_nodes),
            "recent_failures": list(report.failures),
            "pending_demands": [
                {"kind": d.kind, "shape": d.shape, "count": d.count, "gpus": d.gpus} for d in report.demands
            ],
            "expected_nodes": self._nodes,
            "expected_gpus": self._gpus,
        }
        return Diagnosis(self.kind, tuple(findings), data)

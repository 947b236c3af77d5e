"""`dgxdoctor diagnose` for pasted ``nvidia-smi topo -m`` output."""

from __future__ import annotations

import re
from typing import ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.topology import evaluate_topology
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.topo import TopoParseError, parse_topo_matrix, strip_ansi

# A GPU row of the matrix: "GPU0\t X \tNV18\t..." (its diagonal cell is X).
TOPO_ROW_RE = re.compile(r"^\s*GPU0\s+X\s", re.MULTILINE)
# The legend line every era prints: "  NV#  = Connection traversing a bonded set of # NVLinks".
TOPO_LEGEND_RE = re.compile(r"^\s*(NV#|PIX|SYS)\s+=\s+Conn", re.MULTILINE)
# The header: "\tGPU0\tGPU1\t...\tCPU Affinity".
TOPO_HEADER_RE = re.compile(r"^\s*GPU0\s+(GPU1|NIC0|mlx\d_\w+|CPU Affinity)", re.MULTILINE)


class TopoAnalyzer:
    kind: ClassVar[str] = "nvidia-smi-topo"

    def detect(self, text: str) -> bool:
        head = strip_ansi(text[:200_000])
        return bool(TOPO_HEADER_RE.search(head)) and bool(TOPO_ROW_RE.search(head) or TOPO_LEGEND_RE.search(head))

    def analyze(self, text: str) -> Diagnosis:
        try:
            topo = parse_topo_matrix(text)
        except TopoParseError as exc:
            return Diagnosis(
                self.kind,
                (
                    Finding(
                        "TOPO_UNPARSABLE",
                        Status.UNKNOWN,
                        str(exc),
                        remedy="paste the complete, unedited output of `nvidia-smi topo -m`",
                    ),
                ),
            )
        findings = evaluate_topology(topo, require_nvlink=True)
        return Diagnosis(self.kind, tuple(findings), topo.to_data())

"""`dgxdoctor diagnose` for pasted ``ncclras`` output (NCCL's RAS status report, text or ``-f json``)."""

from __future__ import annotations

import re
from typing import ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.ras import layout_findings, rank_findings
from dgxdoctor.records import asdict
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.ras_report import RasReportError, parse_report

# "NCCL version 2.28.9 compiled with CUDA 13.0" then "Job summary" / "Communicators..." (client_support.cc
# :542, :599, :778 at v2.28.9-1).
HEADER_RE = re.compile(r"^NCCL version \S+ compiled with CUDA \S+$", re.MULTILINE)
BODY_RE = re.compile(r"^(Job summary|Communicators\.\.\.|Group     Comms     Nodes)", re.MULTILINE)
# A fragment: "  Rank 11 -- GPU 3 managed by process 48213 on node 10.0.0.2" (:1348) or a process line (:1280).
FRAGMENT_RE = re.compile(r"^  (Rank \d+ .*-- GPU \S+ managed by process \d+ on node \S+|Process \d+ on node \S+ "
                         r"managing GPUs? )", re.MULTILINE)  # fmt: skip
# The JSON report's first keys (jsonWriteHeader, :1892-1898).
JSON_RE = re.compile(r'^\{\s*"nccl_version": "[^"]*",\s*"cuda_runtime_version"')


class RasAnalyzer:
    kind: ClassVar[str] = "ncclras"

    def detect(self, text: str) -> bool:
        head = text[:200_000]
        if JSON_RE.match(head.lstrip()):
            return True
        # The literal texts first: each regex is tried at every line start of up to 200 KB.
        header = "compiled with CUDA" in head and HEADER_RE.search(head) and BODY_RE.search(head)
        return bool(header) or (" on node " in head and bool(FRAGMENT_RE.search(head)))

    def analyze(self, text: str) -> Diagnosis:
        try:
            report = parse_report(text)
        except RasReportError as exc:
            finding = Finding("RAS_REPORT_UNREADABLE", Status.UNKNOWN, str(exc),
                              remedy="paste the complete output of `ncclras` (or `ncclras -f json`)")  # fmt: skip
            return Diagnosis(self.kind, (finding,))
        findings = rank_findings(report)
        if report.communicators or report.nccl_version:
            findings += layout_findings(report, 0)
        serving = report.serving()
        summary = (
            f"NCCL {report.nccl_version or '?'}: largest communicator {serving.size} ranks over {serving.nodes} "
            f"node(s), {len(report.issues)} rank line(s) reported"
            if serving
            else None
        )
        data = {"format": report.format, "nccl_version": report.nccl_version, "timeouts": report.timeouts,
                "communicators": [asdict(c) | {"ranks": len(c.ranks)} for c in report.communicators],
                "issues": [asdict(i) for i in report.issues]}  # fmt: skip
        return Diagnosis(self.kind, tuple(findings), data, summary)

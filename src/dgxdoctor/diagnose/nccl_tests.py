"""`nccl-tests`: bandwidth table of all_reduce_perf and friends, and what is wrong with it.

Data: ``avg_busbw_gbps`` as printed on the "Avg bus bandwidth" line, ``peak_busbw_gbps``, and every row. Findings:
busbw under 1 GB/s at 1 MiB or more (the tutorial: "tens of MB/s means the traffic fell back to TCP"), NCCL
reporting its TCP socket transport between hosts, and out-of-bounds (wrong) results.
"""

from __future__ import annotations

import re
from typing import ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.nccl import (
    DEFAULT_MIN_FRACTION,
    bandwidth_finding,
    bandwidth_summary,
    cross_host_finding,
    nccl_tests_findings,
)
from dgxdoctor.judge.nccl_transport import socket_finding, spans_nodes
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nccl_tests import (
    looks_like_nccl_tests,
    parse_nccl_tests,
)

# Rows of the bandwidth table pasted without its header (a fragment), e.g. (NVIDIA/nccl-tests README):
#    134217728      33554432     float     sum      -1   1046.2  128.29  240.55      0   1045.4  128.39  240.73      0
ROW_FRAGMENT_RE = re.compile(
    r"^\s*\d{1,15}\s+\d{1,15}\s+(?:float|half|bfloat16|double|u?int(?:8|32|64)|fp8_e4m3|fp8_e5m2)\s+"
    r"(?:sum|prod|max|min|avg|none)\s+",
    re.M,
)


def _looks_like_rows(text: str) -> bool:
    if not any(t in text for t in ("float", "half", "double", "int8", "int32", "int64", "fp8_")):
        return False  # no data type of the table: the regex, tried at every line start, cannot match
    return sum(1 for _ in zip(range(2), ROW_FRAGMENT_RE.finditer(text), strict=False)) == 2


class NcclTestsAnalyzer:
    """The nccl check's thresholds (``diagnose --config``: [checks.nccl] expected_busbw_gbps, min_fraction)."""

    kind: ClassVar[str] = "nccl-tests"

    def __init__(self, expected_busbw_gbps: float | None = None, min_fraction: float = DEFAULT_MIN_FRACTION) -> None:
        self._expected = expected_busbw_gbps
        self._min_fraction = min_fraction

    def detect(self, text: str) -> bool:
        return looks_like_nccl_tests(text) or _looks_like_rows(text)

    def analyze(self, text: str) -> Diagnosis:
        try:
            report = parse_nccl_tests(text)
        except ValueError as exc:
            return Diagnosis(
                self.kind,
                (
                    Finding(
                        "NCCL_TESTS_UNPARSABLE",
                        Status.UNKNOWN,
                        str(exc),
                        remedy="pass the complete output of all_reduce_perf (stdout, with its '#' header lines)",
                    ),
                ),
            )
        findings = nccl_tests_findings(report)
        # A paste does not say whether its node had HCAs; one that does not say it stayed on one node is taken
        # as crossing nodes (sockets across hosts are the warning).
        cross = spans_nodes(report.transport, report.hosts) is not False
        socket = socket_finding(report.transport, node_has_ib=None, cross_node=cross)
        if socket is not None:
            findings.append(socket)
        low = (
            bandwidth_finding(report, self._expected, self._min_fraction)
            if self._expected is not None
            else cross_host_finding(report)
        )
        if low is not None:
            findings.append(low)
        data = {**report.to_data(), "expected_busbw_gbps": self._expected}
        return Diagnosis(self.kind, tuple(findings), data, summary=bandwidth_summary(report))

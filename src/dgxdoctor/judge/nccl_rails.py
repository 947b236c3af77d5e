"""Verdicts that compare probe runs: one rail against the others, one node's timing against the peer's."""

from __future__ import annotations

import statistics

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nccl_tests import NcclTestsReport

# Both nodes time the same collectives; their figures differ by the clocks' skew and a few microseconds of launch.
AGREEMENT_TOLERANCE = 0.10

FIX_RAIL = (
    "the named HCA is slower than its siblings: ibstat (rate, state) and the infiniband check's error counters for "
    "it, its cable and switch port, and the same rail on the peer node; drain traffic off it until it matches"
)


def rail_findings(busbw: dict[str, float], rails: list[str], min_fraction: float) -> list[Finding]:
    """Per-rail runs (NCCL_IB_HCA one HCA at a time): a rail below ``min_fraction`` of the median is degraded."""
    if len(busbw) < 2:
        return []
    median = statistics.median(busbw.values())
    findings: list[Finding] = []
    for rail in rails:
        value = busbw.get(rail)
        if value is None:
            continue  # its run failed: named by the run's own finding
        if value < median * min_fraction:
            findings.append(
                Finding(
                    "NCCL_RAIL_DEGRADED",
                    Status.CRITICAL,
                    f"rail {rail}: busbw {value:.1f} GB/s is {value / median:.0%} of the median rail's {median:.1f} "
                    f"GB/s (below {min_fraction:.0%})",
                    rail,
                    remedy=FIX_RAIL,
                )
            )
    if not findings:
        spread = min(busbw.values()) / max(busbw.values()) if max(busbw.values()) > 0 else 1.0
        findings.append(
            Finding("NCCL_RAILS_BALANCED", Status.OK, f"{len(busbw)} rails within {spread:.0%} of each other")
        )
    return findings


def peer_agreement(mine: NcclTestsReport, theirs: NcclTestsReport, peer: str) -> list[Finding]:
    """Both sides of a cross-node run measured the same collective: their busbw at the largest size must agree."""
    a = max(mine.rows, key=lambda r: r.size_bytes)
    b = max(theirs.rows, key=lambda r: r.size_bytes)
    if a.size_bytes != b.size_bytes or a.busbw_gbps is None or b.busbw_gbps is None:
        return [
            Finding(
                "NCCL_PEER_RESULT_MISMATCH",
                Status.WARNING,
                f"the peer's table does not cover the same sizes ({b.size_bytes} B vs {a.size_bytes} B)",
                peer,
            )
        ]
    high = max(a.busbw_gbps, b.busbw_gbps)
    gap = abs(a.busbw_gbps - b.busbw_gbps) / high if high > 0 else 0.0
    text = f"busbw at {a.size_bytes} B: here {a.busbw_gbps:.1f} GB/s, on {peer} {b.busbw_gbps:.1f} GB/s"
    if gap > AGREEMENT_TOLERANCE:
        return [
            Finding(
                "NCCL_PEER_RESULT_MISMATCH",
                Status.WARNING,
                f"the two sides disagree by {gap:.0%}: {text}",
                peer,
                remedy="rerun; a lasting gap means one node's GPUs or NICs are throttled (gpu and infiniband checks)",
            )
        ]
    return [Finding("NCCL_PEER_RESULT", Status.OK, f"both sides agree within {gap:.0%}: {text}", peer)]

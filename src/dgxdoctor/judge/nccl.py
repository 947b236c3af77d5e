"""NCCL bandwidth verdicts: the TCP-fallback floor, wrong results, the expected busbw, the probe's failures.

Shared by ``checks/nccl.py`` (the probe's table) and ``diagnose`` (a pasted nccl-tests table).
"""

from __future__ import annotations

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nccl_tests import MIB, NcclTestsReport

# The tutorial: "带宽只有几十 MB/s,说明流量走了 TCP 回退" -- tens of MB/s at large sizes means TCP fallback.
LOW_BUSBW_GBPS = 1.0
LOW_BUSBW_MIN_SIZE = MIB

# Between hosts with nothing configured: what the slowest RDMA fabric of a serving pair gives. busbw of a two-node
# all-reduce is bounded by the NICs: one 100 Gb/s port (12.5 GB/s) gives ~11 GB/s, one 400 Gb/s NDR port ~45 GB/s,
# a DGX H100/H200 with eight 400 Gb/s rails ~350-400 GB/s (NVIDIA's DGX SuperPOD figures; the runbook: 70 % of the
# NICs' nominal rate). Judged at 64 MiB or more, where the table has left the latency-bound sizes.
CROSS_HOST_CRITICAL_GBPS = 10.0
CROSS_HOST_WARNING_GBPS = 40.0
CROSS_HOST_MIN_SIZE = 64 * MIB

FIX_TCP = (
    "Traffic is on TCP sockets, not RDMA: run ibdev2netdev and set NCCL_IB_HCA to the real HCA names and "
    "NCCL_IB_GID_INDEX (RoCE) on both nodes, mount /dev/infiniband into the container, check ibstat shows the "
    "ports Active, then rerun with NCCL_DEBUG=INFO and look for 'Using network IB'."
)


def nccl_tests_findings(report: NcclTestsReport, tcp_floor: bool = True) -> list[Finding]:
    """The table's own verdicts: the TCP-fallback floor (``tcp_floor``: False for gloo, which runs on the CPU and
    is not held to NCCL's floor) and wrong results. The transport is judged by ``judge.nccl_transport``."""
    findings: list[Finding] = []
    low = [
        r
        for r in report.rows
        if r.size_bytes >= LOW_BUSBW_MIN_SIZE and r.busbw_gbps is not None and r.busbw_gbps < LOW_BUSBW_GBPS
    ]
    if low and tcp_floor:
        worst = min(low, key=lambda r: r.busbw_gbps or 0.0)
        findings.append(
            Finding(
                "NCCL_TESTS_LOW_BUSBW",
                Status.CRITICAL,
                f"bus bandwidth below {LOW_BUSBW_GBPS:g} GB/s at {len(low)} message size(s) of 1 MiB or more: "
                "the rate of a TCP fallback, not of NVLink or InfiniBand",
                f"{worst.size_bytes} B",
                evidence=f"size {worst.size_bytes} B: busbw {worst.out_of_place.busbw_gbps} GB/s out-of-place, "
                f"{worst.in_place.busbw_gbps} GB/s in-place",
                remedy=FIX_TCP,
            )
        )
    if report.out_of_bounds:
        findings.append(
            Finding(
                "NCCL_TESTS_WRONG_RESULTS",
                Status.CRITICAL,
                f"{report.out_of_bounds} result values out of bounds: the collective returned wrong data",
                evidence=f"Out of bounds values : {report.out_of_bounds} FAILED",
                remedy="Rerun on each GPU pair to isolate the GPU or link; check dmesg for XID errors and the IB "
                "port error counters; drain the node until it passes.",
            )
        )
    return findings


BANDWIDTH_LOW_REMEDY = (
    "check every rail: ibstat (all ports Active at full rate), the infiniband check's error counters, NCCL_IB_HCA "
    "listing every HCA, and GPUDirect RDMA (NCCL_NET_GDR_LEVEL)"
)


# busbw under this fraction of the expected is NCCL_BANDWIDTH_LOW (the tutorial's 70 %): [checks.nccl] min_fraction
# and `diagnose` of a pasted table without a config.
DEFAULT_MIN_FRACTION = 0.7


def bandwidth_finding(report: NcclTestsReport, expected_gbps: float | None, min_fraction: float) -> Finding | None:
    """NCCL_BANDWIDTH_LOW: busbw at the largest message size under ``min_fraction`` of the expected busbw
    (checks.nccl.expected_busbw_gbps; the tutorial's 70 % of the NICs' nominal rate)."""
    if expected_gbps is None or not report.rows:
        return None
    largest = max(report.rows, key=lambda r: r.size_bytes)
    peak = largest.busbw_gbps
    if peak is None or peak >= expected_gbps * min_fraction:
        return None
    return Finding(
        "NCCL_BANDWIDTH_LOW",
        Status.CRITICAL,
        f"busbw {peak:.1f} GB/s at {largest.size_bytes} B is below {min_fraction:.0%} of the expected "
        f"{expected_gbps:g} GB/s",
        remedy=BANDWIDTH_LOW_REMEDY,
    )


def cross_host_finding(report: NcclTestsReport) -> Finding | None:
    """NCCL_CROSS_HOST_BUSBW_LOW: a run across two or more hosts, judged against what RDMA fabrics give (used only
    where no expected busbw is configured)."""
    if len(report.hosts) < 2:
        return None
    rows = [r for r in report.rows if r.size_bytes >= CROSS_HOST_MIN_SIZE and r.busbw_gbps is not None]
    if not rows:
        return None
    best = max(rows, key=lambda r: r.busbw_gbps or 0.0)
    peak = best.busbw_gbps or 0.0
    if peak >= CROSS_HOST_WARNING_GBPS:
        return None
    hosts = ", ".join(report.hosts)
    critical = peak < CROSS_HOST_CRITICAL_GBPS
    fabric = (
        "under the ~11 GB/s that even one 100 Gb/s RDMA port gives"
        if critical
        else "under the ~45 GB/s of one 400 Gb/s port; a DGX with eight rails gives ~350 GB/s"
    )
    return Finding(
        "NCCL_CROSS_HOST_BUSBW_LOW",
        Status.CRITICAL if critical else Status.WARNING,
        f"busbw peaks at {peak:.1f} GB/s ({_size(best.size_bytes)}) across {len(report.hosts)} hosts ({hosts}): "
        f"{fabric}",
        evidence=f"size {best.size_bytes} B: busbw {best.out_of_place.busbw_gbps} GB/s out-of-place, "
        f"{best.in_place.busbw_gbps} GB/s in-place",
        remedy=BANDWIDTH_LOW_REMEDY + "; with the fabric's own figure, `diagnose --config` judges against "
        "[checks.nccl] expected_busbw_gbps",
    )


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def bandwidth_summary(report: NcclTestsReport) -> str:
    """One line for people: peak and average busbw, and the network transport NCCL said it used."""
    rated = [r for r in report.rows if r.busbw_gbps is not None]
    peak = max(rated, key=lambda r: r.busbw_gbps or 0.0) if rated else None
    parts = [
        f"busbw peak {peak.busbw_gbps:.2f} GB/s at {_size(peak.size_bytes)}" if peak else "busbw peak n/a",
        "average " + ("n/a" if report.avg_busbw_gbps is None else f"{report.avg_busbw_gbps:.2f} GB/s"),
        f"{len(report.rows)} sizes",
    ]
    if report.transports:
        parts.append("transport " + ", ".join(f"NET/{t}" for t in report.transports))
    elif len(report.hosts) >= 2:
        parts.append(f"across {len(report.hosts)} hosts; transport not in the output (run with NCCL_DEBUG=INFO)")
    else:
        parts.append("transport not in the output (one node, or run with NCCL_DEBUG=INFO to see it)")
    return ", ".join(parts)


def probe_failed(returncode: int, subject: str | None, tail: str) -> Finding:
    """The bandwidth probe ran and printed no table: the collective itself failed between the ranks."""
    return Finding(
        "NCCL_PROBE_FAILED",
        Status.CRITICAL,
        f"the bandwidth probe exited {returncode} without a bandwidth table",
        subject,
        evidence=tail or None,
        remedy="run the probe by hand with NCCL_DEBUG=INFO and read its first WARN line",
    )


def peer_probe_failed(returncode: int, peer: str | None, tail: str) -> Finding:
    """The peer joined and its side of a cross-node probe printed no table."""
    return Finding(
        "NCCL_PEER_PROBE_FAILED",
        Status.CRITICAL,
        f"the peer's side of the probe exited {returncode} without a table",
        peer,
        evidence=tail or None,
        remedy="read the peer's probe output: journalctl -u dgxdoctor on the peer",
    )

"""A pasted all-reduce across two hosts is judged against what RDMA fabrics give, not only the 1 GB/s TCP floor."""

from __future__ import annotations

from msgspec.structs import replace

from conftest import FIXTURES, run_cli
from dgxdoctor.judge.nccl import CROSS_HOST_WARNING_GBPS, bandwidth_summary, cross_host_finding
from dgxdoctor.result import Status
from dgxdoctor.sources.nccl_tests import NcclTestsReport, parse_nccl_tests

TWO_HOSTS = FIXTURES / "nccl_tests" / "two_hosts_4gbps.txt"


def at(report: NcclTestsReport, busbw: float) -> NcclTestsReport:
    """The same table with every row at ``busbw``."""
    rows = tuple(
        replace(
            r, out_of_place=replace(r.out_of_place, busbw_gbps=busbw), in_place=replace(r.in_place, busbw_gbps=busbw)
        )
        for r in report.rows
    )
    return replace(report, rows=rows)


def test_four_gbps_across_two_named_hosts_is_critical() -> None:
    done = run_cli("diagnose", "--json", str(TWO_HOSTS))
    reading = done.json()["inputs"][0]
    assert reading["kind"] == "nccl-tests"
    codes = {f["code"]: f["status"] for f in reading["findings"]}
    assert codes.get("NCCL_CROSS_HOST_BUSBW_LOW") == "critical"
    assert "one node" not in (reading["summary"] or "")
    assert done.returncode == 2


def test_the_floor_moves_with_the_figures_and_needs_two_hosts() -> None:
    report = parse_nccl_tests(TWO_HOSTS.read_text())
    assert report.hosts == ("h100-2", "h100-4")
    finding = cross_host_finding(report)
    assert finding is not None and finding.status is Status.CRITICAL
    faster = replace(
        report,
        rows=tuple(
            replace(
                r, out_of_place=replace(r.out_of_place, busbw_gbps=25.0), in_place=replace(r.in_place, busbw_gbps=25.0)
            )
            for r in report.rows
        ),
    )
    warning = cross_host_finding(faster)
    assert warning is not None and warning.status is Status.WARNING
    assert cross_host_finding(at(report, CROSS_HOST_WARNING_GBPS + 300)) is None
    assert cross_host_finding(replace(report, hosts=("h100-2",))) is None
    assert "across 2 hosts" in bandwidth_summary(report)


def test_a_configured_expectation_rules_instead(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    config = tmp_path / "config.toml"
    config.write_text("[checks.nccl]\nexpected_busbw_gbps = 5.0\nmin_fraction = 0.7\n")
    done = run_cli("diagnose", "--json", "--config", str(config), str(TWO_HOSTS))
    codes = {f["code"] for f in done.json()["inputs"][0]["findings"]}
    assert "NCCL_CROSS_HOST_BUSBW_LOW" not in codes and "NCCL_BANDWIDTH_LOW" not in codes

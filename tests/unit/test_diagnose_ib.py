"""`dgxdoctor diagnose` for ibstat and perfquery output (fixtures/ib, sources in its SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.diagnose.base import diagnose_text
from dgxdoctor.diagnose.infiniband import IbstatAnalyzer, PerfqueryAnalyzer
from dgxdoctor.diagnose.registry import ANALYZERS
from dgxdoctor.result import Status
from dgxdoctor.sources.ibstat import IbstatFormatError, parse_ibstat
from dgxdoctor.sources.perfquery import PerfqueryFormatError, parse_perfquery

IB = Path(__file__).resolve().parents[1] / "fixtures" / "ib"


def text(name: str) -> str:
    return (IB / name).read_text()


def test_ibstat_ndr_ports_shape() -> None:
    d = diagnose_text(text("ibstat_cx7_ndr.txt"), ANALYZERS)
    assert d.kind == "ibstat"
    assert d.findings == ()
    assert d.data["ports"] == [
        {
            "ca": "mlx5_0",
            "port": 1,
            "state": "Active",
            "physical_state": "LinkUp",
            "rate_gbps": 400,
            "link_layer": "InfiniBand",
        },
        {
            "ca": "mlx5_1",
            "port": 1,
            "state": "Active",
            "physical_state": "LinkUp",
            "rate_gbps": 400,
            "link_layer": "InfiniBand",
        },
    ]


def test_ibstat_field_missing_is_null() -> None:
    d = IbstatAnalyzer().analyze(text("ibstat_old_no_link_layer.txt"))
    assert d.data["ports"] == [
        {"ca": "mlx4_0", "port": 1, "state": "Active", "physical_state": "LinkUp", "rate_gbps": 40, "link_layer": None}
    ]


def test_ibstat_roce_space_indented() -> None:
    (port,) = parse_ibstat(text("ibstat_roce.txt"))
    assert (port.ca, port.link_layer, port.rate_gbps, port.ca_type) == ("mlx5_0", "Ethernet", 400.0, "MT4129")


def test_ibstat_ports_not_active_are_findings() -> None:
    d = diagnose_text(text("ibstat_cx6_hdr_down.txt"), ANALYZERS)
    by_code = {f.code: f for f in d.findings}
    assert set(by_code) == {"IB_PORT_DOWN", "IB_PORT_NOT_ACTIVE", "IB_PORT_DISABLED"}
    down = by_code["IB_PORT_DOWN"]
    assert down.status is Status.CRITICAL and down.subject == "mlx5_1/1"
    assert down.evidence == "CA 'mlx5_1' Port 1: State: Down"
    assert down.remedy
    assert by_code["IB_PORT_NOT_ACTIVE"].subject == "mlx5_2/1"
    assert by_code["IB_PORT_DISABLED"].status is Status.WARNING
    assert d.status is Status.CRITICAL
    assert [p["rate_gbps"] for p in d.data["ports"]] == [200, 10, 200, 10]


def test_ibstat_bad_structure_is_a_clear_error() -> None:
    with pytest.raises(IbstatFormatError, match="line 1"):
        parse_ibstat("\tPort 1:\n\t\tState: Active\n")
    d = IbstatAnalyzer().analyze("\tPort 1:\n\t\tState: Active\n")
    assert d.findings[0].code == "UNPARSABLE_INPUT" and d.findings[0].status is Status.UNKNOWN


def test_perfquery_basic_and_extended_clean() -> None:
    basic = diagnose_text(text("perfquery_basic.txt"), ANALYZERS)
    assert basic.kind == "perfquery" and basic.findings == ()
    (block,) = basic.data["ports"]
    assert (block["lid"], block["port"], block["extended"]) == (1, 1, False)
    assert block["counters"]["port_xmit_data"] == 4294967295
    ext = diagnose_text(text("perfquery_extended.txt"), ANALYZERS)
    assert ext.findings == ()
    (block,) = ext.data["ports"]
    assert block["extended"] is True and block["lid"] == 1719
    assert block["counters"]["port_rcv_data"] == 12279028775751
    assert block["counters"]["symbol_error"] == 0
    assert block["counters"]["port_xmit_wait"] == 22730883


def test_perfquery_error_counters_are_findings() -> None:
    d = PerfqueryAnalyzer().analyze(text("perfquery_extended_errors.txt"))
    by_code = {f.code: f for f in d.findings}
    assert set(by_code) == {"IB_SYMBOL_ERROR", "IB_LINK_DOWNED", "IB_PORT_RCV_ERRORS"}
    assert by_code["IB_LINK_DOWNED"].status is Status.CRITICAL
    assert by_code["IB_SYMBOL_ERROR"].status is Status.WARNING
    assert by_code["IB_SYMBOL_ERROR"].evidence == "SymbolErrorCounter:..............1867"
    assert by_code["IB_PORT_RCV_ERRORS"].subject == "lid 1719 port 1"


def test_perfquery_bad_value() -> None:
    with pytest.raises(PerfqueryFormatError, match="PortXmitData"):
        parse_perfquery("# Port extended counters: Lid 1 port 1\nPortXmitData:....................foo\n")


def test_detection_does_not_cross() -> None:
    assert not IbstatAnalyzer().detect(text("perfquery_basic.txt"))
    assert not PerfqueryAnalyzer().detect(text("ibstat_cx7_ndr.txt"))
    assert not IbstatAnalyzer().detect("")


def test_cli_diagnose_ibstat_json() -> None:
    done = run_cli("diagnose", "--json", str(IB / "ibstat_cx6_hdr_down.txt"))
    assert done.returncode == 2, done.stderr
    (inp,) = done.json()["inputs"]
    assert inp["kind"] == "ibstat"
    assert inp["data"]["ports"][1] == {
        "ca": "mlx5_1",
        "port": 1,
        "state": "Down",
        "physical_state": "Polling",
        "rate_gbps": 10,
        "link_layer": "InfiniBand",
    }
    assert {f["code"] for f in inp["findings"]} == {"IB_PORT_DOWN", "IB_PORT_NOT_ACTIVE", "IB_PORT_DISABLED"}

"""NCCL's own INFO lines (real, from public logs; tests/fixtures/nccl_info/SOURCES.md) -> the transport it used."""

from __future__ import annotations

from pathlib import Path

from dgxdoctor.judge.nccl_transport import describe, transport_findings
from dgxdoctor.result import Status
from dgxdoctor.sources.nccl_info import parse_nccl_info, transport_kind

INFO = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_info"


def test_two_nodes_over_the_hpcx_ib_plugin() -> None:
    t = parse_nccl_info((INFO / "ib_two_nodes_hpcx.log").read_text())
    assert t.channels == {"P2P/CUMEM": 4, "NET/IB": 6}
    assert t.via_examples["NET/IB"] == "NET/IBext_v8/3/GDRDMA"
    assert t.network == "IB"
    assert t.net_devices == {"IB": ["mlx5_0:1/IB", "mlx5_2:1/IB"]}
    assert t.oob == "ibs85f0:192.168.1.10<0>"
    assert t.env == {"NCCL_IB_HCA": "mlx5_2:1,mlx5_0:1"}
    assert describe(t) == "P2P/CUMEM x4, NET/IB x6 [mlx5_0:1/IB mlx5_2:1/IB]"
    assert [f.code for f in transport_findings(t, node_has_ib=True)] == ["NCCL_TRANSPORT"]


def test_socket_fallback() -> None:
    t = parse_nccl_info((INFO / "socket_fallback.log").read_text())
    assert t.channels == {"NET/Socket": 3}
    assert t.network == "Socket" and t.ib_absent
    assert t.net_devices == {"Socket": ["lo:127.0.0.1<0>"]}
    assert t.env["NCCL_IB_DISABLE"] == "1" and t.env["NCCL_SOCKET_IFNAME"] == "lo"
    assert t.version == "2.4.7"
    (critical,) = transport_findings(t, node_has_ib=True)
    assert critical.code == "NCCL_SOCKET_FALLBACK" and critical.status is Status.CRITICAL
    (warning,) = transport_findings(t, node_has_ib=False, cross_node=True)
    assert warning.status is Status.WARNING


def test_one_node_with_nvls_and_sharp() -> None:
    t = parse_nccl_info((INFO / "nvls_sharp_one_node.log").read_text())
    assert t.nvls_available is True
    assert (t.ranks, t.nodes) == (8, 1)
    assert t.network == "IB" and len(t.net_devices["IB"]) == 8 and t.net_devices["IB"][0] == "ibp0:1/IB/SHARP"
    assert t.channels == {"P2P/CUMEM": 2}


def test_p2p_direct_pointer_and_the_mpi_prefix() -> None:
    t = parse_nccl_info((INFO / "p2p_direct_and_net_ib.log").read_text())
    assert t.channels == {"P2P/direct": 2, "NET/IB": 3}
    assert t.via_examples["P2P/direct"] == "P2P/direct pointer/read"


def test_transport_kinds() -> None:
    assert transport_kind("NET/IBext/0/GDRDMA") == "NET/IB"
    assert transport_kind("NET/Socket/1") == "NET/Socket"
    assert transport_kind("SHM/direct/direct") == "SHM/direct"
    assert transport_kind("P2P/CUMEM/read") == "P2P/CUMEM"
    assert transport_kind("NVLS") == "NVLS"


def test_no_lines_is_unknown_and_garbage_never_raises() -> None:
    t = parse_nccl_info("NCCL INFO Channel 00/0 : x -> y via\n\x00NCCL INFO NET/IB : Using [\n" + "NCCL " * 10000)
    assert not t.seen
    (unknown,) = transport_findings(t, node_has_ib=True)
    assert unknown.status is Status.UNKNOWN


def test_h200_two_agents_over_sockets() -> None:
    t = parse_nccl_info((INFO / "h200_socket_two_agents.log").read_text())
    assert t.channels == {"NET/Socket": 4} and t.network == "Socket" and t.ib_absent
    assert t.net_devices == {"Socket": ["lo:127.0.0.1<0>"]} and (t.ranks, t.nodes) == (2, 2)
    assert t.env["NCCL_ALGO"] == "Ring" and t.env["NCCL_PROTO"] == "Simple" and t.env["NCCL_P2P_DISABLE"] == "1"
    assert t.version == "2.28.9"
    (finding,) = transport_findings(t, node_has_ib=True, cross_node=True)
    assert finding.code == "NCCL_SOCKET_FALLBACK"


def test_h200_one_node_over_nvlink_is_not_a_socket_transport() -> None:
    t = parse_nccl_info((INFO / "h200_p2p_one_node.log").read_text())
    assert t.network == "Socket" and set(t.channels) == {"P2P/CUMEM"}
    (finding,) = transport_findings(t, node_has_ib=True)
    assert finding.code == "NCCL_TRANSPORT" and finding.status is Status.OK

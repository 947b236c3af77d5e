"""nccl-tests output in every layout it has printed, and the nccl-tests diagnosis."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.diagnose.nccl_tests import NcclTestsAnalyzer
from dgxdoctor.result import Status
from dgxdoctor.sources.nccl_tests import parse_nccl_tests

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_nccl1_layout_bytes_op_res_in_milliseconds() -> None:
    report = parse_nccl_tests(read("nccl1_bytes_res.txt"))
    assert len(report.rows) == 3
    row = report.rows[0]
    assert (row.size_bytes, row.count, row.type, row.redop, row.root) == (10000000, 10000000, "char", "sum", None)
    assert row.out_of_place.time_us == pytest.approx(64.0)  # 0.064 ms
    assert row.in_place.algbw_gbps == pytest.approx(2083.77)
    assert report.avg_busbw_gbps is None


def test_v2_root_without_redop_na_errors_and_warn_lines() -> None:
    report = parse_nccl_tests(read("v2_root_socket.txt"))
    (row,) = report.rows
    assert (row.size_bytes, row.type, row.redop, row.root) == (8, "float", None, 0)
    assert row.out_of_place.time_us == pytest.approx(45.82)
    assert row.out_of_place.wrong is None and row.in_place.wrong is None  # "N/A"
    assert report.hosts == ("v100-gpu-1", "v100-gpu-5")
    assert report.nccl_version == "2.9.6+cuda11.2"


def test_v213_redop_root_wrong_and_avg() -> None:
    report = parse_nccl_tests(read("v213_wrong.txt"))
    assert len(report.rows) == 5
    assert report.avg_busbw_gbps == pytest.approx(95.3009)
    assert report.peak_busbw_gbps == pytest.approx(97.54)
    row = report.rows[0]
    assert (row.size_bytes, row.redop, row.root) == (536870912, "sum", -1)
    assert (row.out_of_place.time_us, row.out_of_place.busbw_gbps) == (10052.0, 93.46)
    assert (row.in_place.time_us, row.in_place.busbw_gbps, row.in_place.wrong) == (9676.9, 97.09, 0.0)
    assert report.out_of_bounds == 0


def test_mpirun_tag_output_prefix() -> None:
    report = parse_nccl_tests(read("mpirun_prefix.txt"))
    assert [r.size_bytes for r in report.rows] == [8, 16, 32]
    assert report.rows[2].in_place.time_us == pytest.approx(13.34)


def test_v218_header_lines() -> None:
    report = parse_nccl_tests(read("v218_socket_low.txt"))
    assert report.tests_version == "2.18.0"
    assert report.collective == "all_gather_perf_mpi"
    assert report.ranks == 2 and report.hosts == ("lab",)
    assert report.avg_busbw_gbps == pytest.approx(0.669677)
    assert len(report.rows) == 8


def test_h200_probe_capture_with_warnings_mixed_in() -> None:
    report = parse_nccl_tests(read("h200_probe_allreduce.txt"))
    assert len(report.rows) == 14
    by_size = {r.size_bytes: r for r in report.rows}
    assert by_size[128 * 2**20].busbw_gbps == pytest.approx(281.32)
    assert by_size[8 * 2**30].busbw_gbps == pytest.approx(346.29)
    assert report.avg_busbw_gbps == pytest.approx(235.66)
    assert report.gpus_per_process == 2


def test_h200_nccl_tests_2196_layout_with_na_row() -> None:
    report = parse_nccl_tests(read("h200_2gpu_2196.txt"))
    assert report.tests_version == "2.19.6"
    sizes = {r.size_bytes: r for r in report.rows}
    assert sizes[128 * 2**20].busbw_gbps == 286.0
    assert sizes[8 * 2**30].busbw_gbps == 348.0
    na = sizes[512 * 2**20]
    assert na.busbw_gbps is None and na.out_of_place.time_us is None
    assert report.peak_busbw_gbps == 348.0


def test_headerless_fragment_read_from_row_end() -> None:
    text = (
        "   536870912     134217728     float     sum      -1    10052   53.41   93.46      0"
        "   9676.9   55.48   97.09      0\n"
    )
    (row,) = parse_nccl_tests(text).rows
    assert (row.redop, row.root, row.out_of_place.busbw_gbps, row.in_place.busbw_gbps) == ("sum", -1, 93.46, 97.09)


def test_transport_lines() -> None:
    # Lines from NVIDIA/nccl#573 (sockets) and NVIDIA/nccl#1066 (IB), in front of a v2.13 table.
    socket = (
        "SHJS-PF4ZKYLL:92777:92777 [0] NCCL INFO NET/Socket : Using [0]eth0:172.27.213.95<0>\n"
        "SHJS-PF4ZKYLL:92777:92777 [0] NCCL INFO Using network Socket\n"
    )
    ib = (
        "gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/RoCE [RO]; "
        "OOB eno1np0:172.18.62.6<0>\n"
        "gcn6:1080060:1080060 [0] NCCL INFO Using network IB\n"
    )
    table = read("v213_wrong.txt")
    assert sorted(parse_nccl_tests(socket + table).transports) == ["Socket"]
    assert sorted(parse_nccl_tests(ib + table).transports) == ["IB"]
    diagnosis = NcclTestsAnalyzer().analyze(socket + table)
    assert [f.code for f in diagnosis.findings] == ["NCCL_SOCKET_TRANSPORT"]
    assert NcclTestsAnalyzer().analyze(ib + table).findings == ()


def test_not_nccl_tests_output_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no nccl-tests result rows"):
        parse_nccl_tests("hello\nworld\n")
    diagnosis = NcclTestsAnalyzer().analyze("algbw busbw but nothing else")
    assert diagnosis.status is Status.UNKNOWN


def test_diagnosis_data_and_tcp_fallback_finding() -> None:
    analyzer = NcclTestsAnalyzer()
    low = analyzer.analyze(read("v218_socket_low.txt"))
    assert [f.code for f in low.findings] == ["NCCL_TESTS_LOW_BUSBW"]
    assert low.findings[0].status is Status.CRITICAL
    assert low.findings[0].subject == "1048576 B"
    good = analyzer.analyze(read("h200_probe_allreduce.txt"))
    assert good.findings == ()
    assert good.data["avg_busbw_gbps"] == pytest.approx(235.66)
    assert good.data["peak_busbw_gbps"] == pytest.approx(346.29)
    first = good.data["rows"][0]
    assert first["size_bytes"] == 1048576
    assert set(first["out_of_place"]) == {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}


def test_out_of_bounds_is_critical() -> None:
    text = read("v213_wrong.txt").replace("Out of bounds values : 0 OK", "Out of bounds values : 12 FAILED")
    diagnosis = NcclTestsAnalyzer().analyze(text)
    assert [f.code for f in diagnosis.findings] == ["NCCL_TESTS_WRONG_RESULTS"]


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("*.txt")))
def test_every_fixture_is_detected(name: str) -> None:
    assert NcclTestsAnalyzer().detect(read(name))

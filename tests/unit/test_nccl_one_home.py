"""NCCL's INFO lines have one reader (sources.nccl_info) and the socket transport one verdict
(judge.nccl_transport), whether they come from the nccl check's probe or a pasted nccl-tests run; the check
filters no finding by its code, and the check and its cross-node driver do not import each other."""

from __future__ import annotations

import ast
from pathlib import Path

from dgxdoctor.checks.nccl import NcclSettings, ProbeRun, judge_runs
from dgxdoctor.diagnose.nccl_tests import NcclTestsAnalyzer
from dgxdoctor.result import Finding
from dgxdoctor.sources.nccl_info import parse_nccl_info
from dgxdoctor.sources.nccl_tests import parse_nccl_tests

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHECKS = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor" / "checks"
TABLE = (FIXTURES / "nccl_tests" / "h200_probe_allreduce.txt").read_text()
IB_LINES = (FIXTURES / "nccl_info" / "ib_two_nodes_hpcx.log").read_text()
# Two hosts over sockets (NVIDIA/nccl#573's lines), as both the probe and a pasted run print them.
SOCKET_LINES = (
    "#  Rank  0 Group  0 Pid  92777 on SHJS-PF4ZKYLL device  0 [0x81] NVIDIA A100\n"
    "#  Rank  1 Group  0 Pid  92778 on SHJS-OTHER device  0 [0x81] NVIDIA A100\n"
    "SHJS-PF4ZKYLL:92777:92777 [0] NCCL INFO NET/Socket : Using [0]eth0:172.27.213.95<0>\n"
    "SHJS-PF4ZKYLL:92777:92777 [0] NCCL INFO Using network Socket\n"
)


def test_a_pasted_table_reads_its_info_lines_with_the_one_parser() -> None:
    """HPC-X's IBext_v8 plugin is IB to both (the table's own regexes read it as a transport named 'IBext_v8')."""
    text = IB_LINES + TABLE
    report = parse_nccl_tests(text)
    assert report.transport == parse_nccl_info(text)
    assert sorted(report.transports) == ["IB"]


def _socket(findings: tuple[Finding, ...] | list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.code, f.status.value, f.message) for f in findings if "SOCKET" in f.code]


def test_the_probe_and_a_paste_get_the_same_socket_verdict() -> None:
    probe = judge_runs([ProbeRun(0, SOCKET_LINES + TABLE, "")], NcclSettings(), node_has_ib=False)
    pasted = NcclTestsAnalyzer().analyze(SOCKET_LINES + TABLE)
    assert len(_socket(probe.findings)) == 1
    assert [f[:2] for f in _socket(probe.findings)] == [("NCCL_SOCKET_TRANSPORT", "warning")]
    assert [f[:2] for f in _socket(pasted.findings)] == [("NCCL_SOCKET_TRANSPORT", "warning")]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_check_and_its_cross_node_driver_do_not_import_each_other() -> None:
    assert "dgxdoctor.checks.nccl" not in _imports(CHECKS / "nccl_cross.py")


def test_the_check_drops_no_finding_by_its_code() -> None:
    tree = ast.parse((CHECKS / "nccl.py").read_text(encoding="utf-8"))
    by_code = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare)
        and isinstance(n.left, ast.Attribute)
        and n.left.attr == "code"
        and any(isinstance(op, ast.NotIn | ast.In | ast.NotEq) for op in n.ops)
    ]
    assert by_code == []

"""`dgxdoctor diagnose` on pasted ncclras output (reports composed from NCCL's format strings, fixtures/ras)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.result import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
H200 = Path(__file__).resolve().parents[2] / "docs" / "h200"


def kinds(text: str) -> list[tuple[str, Status, list[str]]]:
    return [(d.kind, d.status, [f.code for f in d.findings]) for d in diagnose(text)]


def test_healthy_report() -> None:
    (d,) = diagnose((FIXTURES / "healthy_2x8.txt").read_text())
    assert (d.kind, d.status, d.findings) == ("ncclras", Status.OK, ())
    assert d.summary == "NCCL 2.28.9: largest communicator 16 ranks over 2 node(s), 0 rank line(s) reported"


@pytest.mark.parametrize("name", ["stall_rank11.txt", "stall_rank11.json", "stall_rank11_v2.30.json"])
def test_stall_names_rank_11(name: str) -> None:
    (d,) = diagnose((FIXTURES / name).read_text())
    assert d.kind == "ncclras" and d.status is Status.CRITICAL
    f = d.findings[0]
    assert (f.code, f.subject) == ("RAS_RANK_UNRESPONSIVE", "rank 11")
    assert "process 48213 on 10.0.0.2" in f.message


def test_dead_process() -> None:
    codes = kinds((FIXTURES / "dead_rank11.txt").read_text())[0][2]
    assert codes == ["RAS_RANK_DEAD", "RAS_RANK_BEHIND"]


def test_a_pasted_fragment_is_enough() -> None:
    text = "#0-0 (7f3a9e0c21d4b6a1) INCOMPLETE\n  Missing communicator data from 1 rank\n" \
        "  Rank 11 -- GPU 3 managed by process 48213 on node 10.0.0.2\n"  # fmt: skip
    assert kinds(text) == [("ncclras", Status.CRITICAL, ["RAS_RANK_UNRESPONSIVE"])]


def test_recorded_ncclras_output() -> None:
    """What NCCL's own ncclras 2.28.3 printed against NCCL 2.28.9 on the H200 machine (one rank, healthy)."""
    text = (H200 / "ras-2026-12-01" / "ncclras.txt").read_text()
    (d,) = diagnose(text)
    assert (d.kind, d.status, d.findings) == ("ncclras", Status.OK, ())
    assert d.summary == "NCCL 2.28.9: largest communicator 1 ranks over 1 node(s), 0 rank line(s) reported"

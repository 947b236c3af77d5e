"""proc_table: /proc/<pid>/stat and cmdline parsing on the real lines of a vLLM server, and malformed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.sources.proc_table import (
    CLK_TCK,
    ProcFormatError,
    iter_processes,
    parse_btime,
    parse_cmdline,
    parse_proc_stat,
    read_process,
)


def test_real_engine_stat_line(fixtures: Path) -> None:
    stat = parse_proc_stat((fixtures / "vllm" / "proc" / "7573" / "stat").read_text())
    assert stat.state == "S"
    assert stat.cpu_ticks == 644 + 105
    assert stat.start_ticks == 177676


def test_comm_with_spaces_and_parentheses() -> None:
    line = "42 (a) b (c)) T 1 42 42 0 -1 4194560 1 0 0 0 7 3 0 0 20 0 1 0 555 0 0"
    stat = parse_proc_stat(line)
    assert (stat.state, stat.cpu_ticks, stat.start_ticks) == ("T", 10, 555)


@pytest.mark.parametrize("line", ["", "garbage", "42 (x) S 1 2", "42 (x) S " + "a " * 30])
def test_malformed_stat(line: str) -> None:
    with pytest.raises(ProcFormatError):
        parse_proc_stat(line)


def test_cmdline_and_title() -> None:
    assert parse_cmdline(b"python\0-m\0vllm.entrypoints.openai.api_server\0") == (
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    )
    assert parse_cmdline(b"VLLM::EngineCore" + b"\0" * 100) == ("VLLM::EngineCore",)
    assert parse_cmdline(b"") == ()


def test_btime() -> None:
    assert parse_btime("cpu  1 2 3\nbtime 1796003545\nprocesses 9\n") == 1796003545.0
    assert parse_btime("cpu 1 2 3\n") is None


def test_processes_of_a_copied_tree(fixtures: Path) -> None:
    root = fixtures / "vllm" / "proc"
    procs = {p.pid: p for p in iter_processes(root)}
    assert set(procs) == {7538, 7573}
    api = procs[7538]
    assert api.cmdline[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    assert api.start_time == pytest.approx(1796003545 + 177008 / CLK_TCK)
    assert read_process(root, 99999) is None
    assert list(iter_processes(root / "nope")) == []

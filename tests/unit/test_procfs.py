"""procfs: the one reader of the process table. Real lines of a vLLM server (tests/fixtures/vllm/proc), of a Ray
head's /proc/net/tcp{,6} (tests/fixtures/ray), proc trees laid out in tmp_path, and malformed input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dgxdoctor.sources.procfs import (
    CLK_TCK,
    ProcessInfo,
    ProcFormatError,
    command_matches,
    iter_processes,
    listening_ports,
    parse_btime,
    parse_cmdline,
    parse_netns_link,
    parse_proc_net_tcp,
    parse_proc_stat,
    parse_status_uid,
    processes_named,
    read_process,
    runs_package,
)
from proctree import stat_line, write_process

RAY = Path(__file__).resolve().parents[1] / "fixtures" / "ray"


# ----- parsers ------------------------------------------------------------------------------------------------


def test_real_engine_stat_line(fixtures: Path) -> None:
    stat = parse_proc_stat((fixtures / "vllm" / "proc" / "7573" / "stat").read_text())
    assert stat.state == "S"
    assert (stat.utime, stat.stime) == (644, 105)
    assert stat.cpu_ticks == 644 + 105
    assert stat.start_ticks == 177676


def test_comm_with_spaces_and_parentheses() -> None:
    line = "42 (a) b (c)) T 1 42 42 0 -1 4194560 1 0 0 0 7 3 0 0 20 0 1 0 555 0 0"
    stat = parse_proc_stat(line)
    assert (stat.state, stat.cpu_ticks, stat.start_ticks) == ("T", 10, 555)
    assert parse_proc_stat(stat_line(4242, "ray::IDLE) (x", "R")).state == "R"


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
    # a title rewritten as one string (setproctitle): split on spaces, as ps and psutil show it
    assert parse_cmdline(b"ray::IDLE worker\0\0") == ("ray::IDLE", "worker")
    assert parse_cmdline(b"/usr/bin/python3\0my script.py\0") == ("/usr/bin/python3", "my script.py")


def test_btime() -> None:
    assert parse_btime("cpu  1 2 3\nbtime 1796003545\nprocesses 9\n") == 1796003545.0
    assert parse_btime("cpu 1 2 3\n") is None


def test_status_uid_and_netns_link() -> None:
    status = "Name:\tcat\nState:\tR (running)\nUid:\t1000\t1001\t1002\t1003\nGid:\t0\t0\t0\t0\n"
    assert parse_status_uid(status) == 1000  # the real uid
    assert parse_status_uid("Name:\tcat\n") is None
    assert parse_netns_link("net:[4026531840]") == 4026531840
    assert parse_netns_link("mnt:[4026531840]") is None


def test_listening_ports_of_the_real_head_namespace(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_bytes((RAY / "head-proc-net-tcp.txt").read_bytes())
    (tmp_path / "net" / "tcp6").write_bytes((RAY / "head-proc-net-tcp6.txt").read_bytes())
    ports = listening_ports(tmp_path)
    assert ports is not None
    assert {6379, 8265} <= ports  # GCS only on tcp6 ([::]), dashboard only on tcp (0.0.0.0)
    v4 = parse_proc_net_tcp((RAY / "head-proc-net-tcp.txt").read_text())
    assert 6379 not in {s.port for s in v4 if s.state == "0A"}


def test_listening_ports_unreadable_is_none(tmp_path: Path) -> None:
    assert listening_ports(tmp_path) is None


# ----- matching rules ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wanted", "name", "cmdline", "expected"),
    [
        (
            "raylet",
            "raylet",
            ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--x=1"),
            True,
        ),
        ("vllm", "python3", ("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"), True),
        ("vllm", "vllm", ("/venv/bin/python", "/venv/bin/vllm", "serve", "m"), True),
        ("vllm", "python3", ("python3", "-m", "dgxdoctor", "check", "--only", "vllm"), False),
        ("vllm", "python3", ("python3", "serve.py", "--model", "/models/vllm-test"), False),
        ("raylet", "bash", ("bash", "-c", "tail -f /tmp/ray/session_latest/logs/raylet.out"), False),
        ("dashboard_agent", "dashboard_agen", ("python3", "agent.py"), False),  # 14 characters: not cut
        ("dashboard_agent_x", "dashboard_agent", (), True),  # cut at 15 by the kernel
    ],
)
def test_command_matching(wanted: str, name: str, cmdline: tuple[str, ...], expected: bool) -> None:
    assert command_matches(wanted, name, cmdline) is expected


def test_runs_package() -> None:
    assert runs_package(["/opt/vllm/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], "vllm")
    assert runs_package(["/opt/vllm/bin/python3", "/opt/vllm/bin/vllm", "serve", "m"], "vllm")
    assert runs_package(["python", "/x/lib/python3.11/site-packages/ray/_private/workers/default_worker.py"], "ray")
    assert not runs_package(["python3", "-m", "pytest", "tests/integration/test_vllm_real.py"], "vllm")
    assert not runs_package(["vllm"], "vllm")  # argv[0] is the interpreter, not what it runs


# ----- reading a tree ------------------------------------------------------------------------------------------


def test_processes_of_a_copied_tree(fixtures: Path) -> None:
    root = fixtures / "vllm" / "proc"
    procs = {p.pid: p for p in iter_processes(root)}
    assert set(procs) == {7538, 7573}
    api = procs[7538]
    assert api.cmdline[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    assert api.start_time == pytest.approx(1796003545 + 177008 / CLK_TCK)
    assert procs[7573].cmdline == ("VLLM::EngineCore",)
    assert read_process(root, 99999) is None
    assert list(iter_processes(root / "nope")) == []


def test_every_field_of_a_laid_out_process(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1796003545\n")
    argv = ["/opt/vllm/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]
    write_process(
        tmp_path,
        7538,
        "python3",
        argv,
        state="R",
        uid=1000,
        exe="/usr/bin/python3.11",
        netns="net:[4026531840]",
        utime=638,
        stime=75,
        start_ticks=177008,
    )
    proc = read_process(tmp_path, 7538)
    assert proc is not None
    assert (proc.pid, proc.comm, proc.cmdline) == (7538, "python3", tuple(argv))
    assert (proc.exe, proc.uid, proc.netns) == ("/usr/bin/python3.11", 1000, 4026531840)
    assert (proc.state, proc.alive, proc.utime, proc.stime, proc.cpu_ticks) == ("R", True, 638, 75, 713)
    assert proc.start_ticks == 177008
    assert proc.start_time == pytest.approx(1796003545 + 177008 / CLK_TCK)
    assert proc.matches("vllm") and not proc.matches("raylet")


def test_unreadable_fields_are_empty_not_errors(tmp_path: Path) -> None:
    (tmp_path / "12").mkdir()  # a process that exited while listed: its directory is empty
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "stat").write_text("garbage\n")
    procs = {p.pid: p for p in iter_processes(tmp_path)}
    assert set(procs) == {12, 13}
    for proc in procs.values():
        assert (proc.comm, proc.cmdline, proc.exe, proc.uid, proc.netns) == ("", (), None, None, None)
        assert (proc.stat, proc.state, proc.cpu_ticks, proc.start_ticks, proc.start_time) == (
            None,
            "?",
            None,
            None,
            None,
        )
        assert proc.alive  # unknown is not dead
    assert read_process(tmp_path, 12) is None and read_process(tmp_path, 13) is None
    with pytest.raises(OSError):
        procs[12].environ()


def test_fields_are_read_when_first_asked_and_then_kept(tmp_path: Path) -> None:
    write_process(tmp_path, 5, "before")
    (proc,) = iter_processes(tmp_path)  # listing reads nothing of the process
    (tmp_path / "5" / "comm").write_text("after\n")
    assert proc.comm == "after"
    (tmp_path / "5" / "comm").write_text("later\n")
    assert proc.comm == "after"  # kept
    assert ProcessInfo(tmp_path, 5).comm == "later"  # a new record reads again


def test_deleted_executable_loses_the_kernel_suffix(tmp_path: Path) -> None:
    write_process(tmp_path, 5, "python3", ["python3"], exe="/opt/old/bin/python3.11 (deleted)")
    assert ProcessInfo(tmp_path, 5).exe == "/opt/old/bin/python3.11"


def test_environ_is_read_raw(tmp_path: Path) -> None:
    write_process(tmp_path, 5, "raylet")
    (tmp_path / "5" / "environ").write_bytes(b"NCCL_DEBUG=WARN\0HOME=/root\0")
    assert ProcessInfo(tmp_path, 5).environ() == b"NCCL_DEBUG=WARN\0HOME=/root\0"


def test_processes_named_skips_other_names_and_other_network_namespaces(tmp_path: Path) -> None:
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "net").symlink_to("net:[4026531840]")
    write_process(tmp_path, 10, "raylet", netns="net:[4026531840]")
    write_process(tmp_path, 11, "gcs_server", netns="net:[4026531840]")
    write_process(tmp_path, 12, "raylet", state="Z", netns="net:[4026531840]")
    write_process(tmp_path, 13, "raylet", netns="net:[4026532999]")  # another node's namespace
    write_process(tmp_path, 14, "python3", netns="net:[4026531840]")
    write_process(tmp_path, 15, "raylet")  # namespace unreadable: kept
    found = processes_named(tmp_path, ("raylet", "gcs_server"))
    assert [(p.pid, p.comm, p.alive) for p in found] == [
        (10, "raylet", True),
        (11, "gcs_server", True),
        (12, "raylet", False),
        (15, "raylet", True),
    ]
    assert [p.pid for p in processes_named(tmp_path, ("raylet",), same_netns=False)] == [10, 12, 13, 15]


def test_the_real_proc_is_read() -> None:
    me = read_process(Path("/proc"), os.getpid())
    assert me is not None
    assert me.uid == os.getuid() and me.cmdline and me.exe is not None
    assert me.state in ("R", "S") and me.start_time is not None

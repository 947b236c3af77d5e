"""The `nccl` bandwidth probe check: verdicts over real probe outputs and NCCL INFO lines, the serving guard, the
maintenance windows, the pinned NCCL environment, per-rail verdicts, and a real subprocess run."""

from __future__ import annotations

import stat
import sys
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest

from dgxdoctor.checks.nccl import NcclCheck, NcclSettings, ProbeRun, judge, judge_runs, probe_env
from dgxdoctor.checks.nccl_guard import in_window, parse_window
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from proctree import write_process

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
INFO = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_info"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
TABLE = (NCCL / "h200_probe_allreduce.txt").read_text()
IB_LINES = (INFO / "ib_two_nodes_hpcx.log").read_text()
# Without its "NET/IB : No device found" line: the failure catalog reads that one as missing IB on its own.
SOCKET_LINES = "".join(
    line for line in (INFO / "socket_fallback.log").read_text().splitlines(True) if "No device" not in line
)


def _sample(result, name: str) -> float:  # type: ignore[no-untyped-def]
    return next(s.value for s in result.samples if s.metric.name == name)


def _quiet_env(tmp_path: Path, **kw) -> Environment:  # type: ignore[no-untyped-def]
    """No vLLM on this (fake) node: an empty procfs."""
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    return Environment(proc_root=proc, sysfs_root=tmp_path / "sys", **kw)


def _settings(**kw) -> NcclSettings:  # type: ignore[no-untyped-def]
    return NcclSettings(vllm_url="", env_file=None, **kw)


def test_real_h200_probe_output_with_its_transport_is_ok_and_exports_busbw() -> None:
    # Captured on the H200 test machine (docs/h200/allreduce.txt): 346.29 GB/s at 8 GiB.
    result = judge(TABLE + IB_LINES, "", 0, NcclSettings())
    assert result.status is Status.OK, result.findings
    assert _sample(result, "dgxdoctor_nccl_busbw_bytes_per_second") == pytest.approx(346.29e9)
    assert "NET/IB" in result.summary


def test_a_table_without_transport_lines_is_unknown_not_ok() -> None:
    result = judge(TABLE, "", 0, NcclSettings())
    assert result.status is Status.UNKNOWN
    assert "NCCL_TRANSPORT_UNREPORTED" in {f.code for f in result.findings}


def test_socket_fallback_on_a_node_with_ib_is_critical_whatever_the_bandwidth() -> None:
    result = judge(TABLE + SOCKET_LINES, "", 0, NcclSettings(), node_has_ib=True)
    assert result.status is Status.CRITICAL
    found = next(f for f in result.findings if f.code == "NCCL_SOCKET_FALLBACK")
    assert "NET/Socket" in found.message and found.remedy


def test_socket_transport_on_a_node_without_ib_is_reported_not_critical() -> None:
    result = judge(TABLE + SOCKET_LINES, "", 0, NcclSettings(), node_has_ib=False)
    assert result.status is Status.OK
    assert "NCCL_SOCKET_TRANSPORT" in {f.code for f in result.findings}


def test_below_seventy_percent_of_expected_is_critical() -> None:
    settings = NcclSettings(expected_busbw_gbps=600.0)
    result = judge(TABLE + IB_LINES, "", 0, settings)
    assert result.status is Status.CRITICAL
    assert "NCCL_BANDWIDTH_LOW" in {f.code for f in result.findings}


def test_tcp_fallback_bandwidth_is_critical() -> None:
    result = judge((NCCL / "v218_socket_low.txt").read_text(), "", 0, NcclSettings())
    assert result.status is Status.CRITICAL
    assert "NCCL_TESTS_LOW_BUSBW" in {f.code for f in result.findings}


def test_failed_probe_names_the_nccl_error() -> None:
    stderr = (LOGS / "nccl_net_failure.log").read_text()
    result = judge("", stderr, 1, NcclSettings())
    codes = {f.code for f in result.findings}
    assert result.status is Status.CRITICAL
    assert {"NCCL_PROBE_FAILED", "NCCL_NET_FAILURE"} <= codes
    assert _sample(result, "dgxdoctor_nccl_probe_success") == 0


def test_a_peer_that_never_joined_is_unknown_with_the_reason() -> None:
    run = ProbeRun(4, "", "# rank 0: not every node joined within 5 s", peer_error="dgx-b:9835 unreachable")
    result = judge_runs([run], NcclSettings(peer="http://dgx-b:9835", join_timeout_s=5), node_has_ib=True)
    assert result.status is Status.UNKNOWN
    found = next(f for f in result.findings if f.code == "NCCL_PEER_NOT_JOINED")
    assert "5 s" in found.message and found.evidence == "dgx-b:9835 unreachable"


def test_both_sides_of_a_cross_node_run_are_compared() -> None:
    peer = ProbeRun(0, TABLE + IB_LINES, "", has_ib=True)
    run = ProbeRun(0, TABLE + IB_LINES, "", peer=peer)
    result = judge_runs([run], NcclSettings(peer="http://dgx-b:9835"), node_has_ib=True)
    assert result.status is Status.OK, result.findings
    assert "NCCL_PEER_RESULT" in {f.code for f in result.findings}
    slow = TABLE.replace("346.29", "200.00")
    result = judge_runs(
        [ProbeRun(0, TABLE + IB_LINES, "", peer=ProbeRun(0, slow + IB_LINES, ""))],
        NcclSettings(peer="http://dgx-b:9835"),
        node_has_ib=True,
    )
    assert "NCCL_PEER_RESULT_MISMATCH" in {f.code for f in result.findings}


def test_the_degraded_rail_is_named() -> None:
    runs = [ProbeRun(0, TABLE + IB_LINES, "", rail=f"mlx5_{i}") for i in range(4)]
    runs[2] = ProbeRun(0, TABLE.replace("346.29", "150.00") + IB_LINES, "", rail="mlx5_2")
    result = judge_runs(runs, NcclSettings(rails=[f"mlx5_{i}" for i in range(4)]), node_has_ib=True)
    assert result.status is Status.CRITICAL
    bad = [f for f in result.findings if f.code == "NCCL_RAIL_DEGRADED"]
    assert [f.subject for f in bad] == ["mlx5_2"]
    rails = {s.labels["device"]: s.value for s in result.samples if "rail_busbw" in s.metric.name}
    assert rails["mlx5_2"] == pytest.approx(150e9) and len(rails) == 4
    assert "mlx5_2 150.0" in result.summary


def test_probe_env_pins_algo_and_proto_reads_the_env_file_and_sets_the_rail(tmp_path: Path) -> None:
    env_file = tmp_path / "nccl.sh"
    env_file.write_text("export NCCL_IB_HCA=mlx5_0,mlx5_1\nNCCL_DEBUG_FILE=/tmp/x\nPATH=/bad\nexport NCCL_ALGO=Tree\n")
    env = probe_env(NcclSettings(env_file=env_file), rail="mlx5_3")
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_PROTO"] == "Simple"
    assert env["NCCL_IB_HCA"] == "=mlx5_3"
    assert env["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG_FILE" not in env and "PATH" not in env
    assert probe_env(NcclSettings(env_file=env_file, algo="", proto=""))["NCCL_ALGO"] == "Tree"
    assert "NCCL_PROTO" not in probe_env(NcclSettings(env_file=None, proto=""))


def test_bad_settings_are_refused() -> None:
    from dgxdoctor.validation import validate

    for bad in ({"algo": "Ring; rm -rf /"}, {"rails": ["mlx5_0 --x"]}, {"maintenance_windows": ["Sat 25:00-26:00"]}):
        with pytest.raises(msgspec.ValidationError):
            validate(NcclSettings, bad)


def test_runs_the_configured_command_for_real_with_the_pinned_env(tmp_path: Path) -> None:
    probe = tmp_path / "all_reduce_perf"
    probe.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"sys.stdout.write(open({str(NCCL / 'h200_probe_allreduce.txt')!r}).read())\n"
        f"sys.stdout.write(open({str(INFO / 'ib_two_nodes_hpcx.log')!r}).read())\n"
        "print('algo', os.environ['NCCL_ALGO'], os.environ['NCCL_PROTO'], os.environ['NCCL_DEBUG'])\n"
    )
    probe.chmod(probe.stat().st_mode | stat.S_IXUSR)
    check = NcclCheck(_settings(command=[str(probe), "-b", "8M"]), _quiet_env(tmp_path))
    result = check.run()
    assert result.status is Status.OK, result.findings


def test_missing_probe_binary_is_skipped(tmp_path: Path) -> None:
    check = NcclCheck(_settings(command=[str(tmp_path / "nope")]), _quiet_env(tmp_path))
    assert check.run().status is Status.SKIPPED


def test_refuses_while_vllm_runs_on_the_node_unless_forced(tmp_path: Path) -> None:
    env = _quiet_env(tmp_path)
    write_process(env.proc_root, 4242, "python3", ["/opt/vllm/bin/python3", "-m", "vllm.entrypoints.openai.api_server"])
    result = NcclCheck(_settings(command=[str(tmp_path / "nope")]), env).run()
    assert result.status is Status.SKIPPED and "4242" in result.summary and "force" in result.summary
    forced = NcclCheck(_settings(command=[str(tmp_path / "nope")], force=True), env).run()
    assert "4242" not in forced.summary


def test_daemon_runs_the_probe_only_inside_a_maintenance_window(tmp_path: Path) -> None:
    saturday_3am = datetime(2026, 11, 28, 3, 0, tzinfo=timezone.utc).timestamp()
    env = _quiet_env(tmp_path, one_shot=False, clock=lambda: saturday_3am)
    none = NcclCheck(_settings(command=[str(tmp_path / "nope")]), env).run()
    assert none.status is Status.SKIPPED and "no maintenance window" in none.summary
    outside = NcclCheck(_settings(command=[str(tmp_path / "nope")], maintenance_windows=["Sun 02:00-04:00"]), env)
    assert "outside the maintenance windows" in outside.run().summary
    inside = NcclCheck(_settings(command=[str(tmp_path / "nope")], maintenance_windows=["Sat 02:00-04:00"]), env)
    assert "not found" in inside.run().summary


def test_maintenance_windows_parse_and_span_midnight() -> None:
    friday_2330 = datetime(2026, 11, 27, 23, 30, tzinfo=timezone.utc).timestamp()
    saturday_0030 = datetime(2026, 11, 28, 0, 30, tzinfo=timezone.utc).timestamp()
    assert in_window(["Fri 23:00-01:00"], friday_2330) and in_window(["Fri 23:00-01:00"], saturday_0030)
    assert not in_window(["Sat 23:00-01:00"], saturday_0030)
    assert in_window(["Mon-Sun 00:00-24:00"], saturday_0030)
    assert parse_window("Fri-Mon 01:00-02:00").days == frozenset({4, 5, 6, 0})
    for bad in ("Sat 02:00", "Funday 01:00-02:00", "01:00-01:00", "1:00-2:00"):
        with pytest.raises(ValueError):
            parse_window(bad)


def test_bundled_probe_argv_uses_the_serving_python_and_the_env() -> None:
    check = NcclCheck(NcclSettings(serving_python="/opt/vllm/bin/python", gpus=8, env_file=None), Environment())
    argv = check.argv()
    assert argv is not None
    assert argv[0] == "env" and "NCCL_ALGO=Ring" in argv and "NCCL_PROTO=Simple" in argv
    program = argv[argv.index("/opt/vllm/bin/python") :]
    assert program[1] == "-I" and program[2].endswith("probes/allreduce.py")
    assert program[-2:] == ["--gpus", "8"]
    cross = NcclCheck(
        NcclSettings(serving_python="/opt/vllm/bin/python", env_file=None, quick=True, master_addr="10.0.0.1"),
        Environment(),
    ).argv(nnodes=2, node_rank=0)
    assert cross is not None and "--quick" in cross
    assert cross[cross.index("--nnodes") + 1] == "2" and cross[cross.index("--master-addr") + 1] == "10.0.0.1"


def test_probe_sizes_parse() -> None:
    from dgxdoctor.probes.allreduce import iters_for, parse_size, sizes

    assert parse_size("8M") == 8 << 20
    assert parse_size("1G") == 1 << 30
    assert sizes(1 << 20, 8 << 20, 2) == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    assert iters_for(1 << 20, 20) == 160 and iters_for(64 << 20, 20) == 20 and iters_for(1024, 20) == 200


def test_exit_statuses_are_the_probes() -> None:
    from dgxdoctor.checks import nccl
    from dgxdoctor.probes import allreduce

    assert nccl.EX_NOT_RUNNABLE == allreduce.EX_NOT_RUNNABLE
    assert nccl.EX_PEER_MISSING == allreduce.EX_PEER_MISSING


def test_a_running_probe_reports_its_progress(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "for i in (1, 2):\n    print(f'# progress {i}/2 1048576 B busbw 1.0 GB/s', file=sys.stderr, flush=True)\n"
        "print('noise', file=sys.stderr)\n"
        f"sys.stdout.write(open({str(NCCL / 'h200_probe_allreduce.txt')!r}).read())\n"
        f"sys.stdout.write(open({str(INFO / 'ib_two_nodes_hpcx.log')!r}).read())\n"
    )
    probe.chmod(probe.stat().st_mode | stat.S_IXUSR)
    env = _quiet_env(tmp_path, state_dir=tmp_path / "state")
    check = NcclCheck(_settings(command=[str(probe)]), env)
    lines: list[str] = []
    check.attach_progress(lines.append)
    assert check.run().status is Status.OK
    assert lines == ["nccl: progress 1/2 1048576 B busbw 1.0 GB/s", "nccl: progress 2/2 1048576 B busbw 1.0 GB/s"]
    kept = (tmp_path / "state" / "nccl" / "last-probe.txt").read_text()
    assert "Avg bus bandwidth" in kept and "noise" in kept


def test_a_streamed_probe_past_its_timeout_is_killed(tmp_path: Path) -> None:
    from dgxdoctor.sources.commands import CommandTimeout, run_command_lines

    with pytest.raises(CommandTimeout):
        run_command_lines([sys.executable, "-c", "import time; time.sleep(30)"], 0.5, lambda line: None)

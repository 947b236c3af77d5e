"""Another user's forged vLLM ranks never decide the head's action, end to end, on the multi-node harness
(tests/harness): "dgx-a" the head, "dgx-b" a worker of vLLM's multiprocessing executor, each in its own network and
PID namespace, both running the shipped ``vllm-head-mp.service`` / ``vllm-worker-mp.service`` with the vLLM
stand-in (root's, as the units run it: its ranks ``VLLM::Worker_TP8`` .. ``TP15`` on the worker), act mode, and each
node's fake ``systemctl`` recording every call.

Inside the worker's PID namespace, nobody (``setpriv`` to 65534) titles processes like vLLM's ranks with ``exec -a``:

- ``VLLM::Worker_TP9`` (a live rank's own title), stopped: the worker stays OK (the look-alike counted, not judged),
  the head's comparison finds nothing and, over several comparisons of the worker's state, systemctl is never
  called (before issue 34: the worker CRITICAL ``VLLM_MP_HEADLESS_STOPPED``, the head's ``PEER_MP_WORKER_DOWN``, a
  cluster restart asked for by nobody);
- nobody's ``VLLM::Worker_TP11`` and ``VLLM::Worker_TP3`` started, then the real ``VLLM::Worker_TP11`` SIGKILLed
  (in this order no run of the worker's check sees the rank gone without the look-alikes): the worker is CRITICAL
  ``VLLM_MP_WORKERS_MISSING`` and the head runs what docs/remediation.md promises for it (``PEER_MP_WORKER_DOWN``,
  ``restart_cluster``): exactly the mp order, once (before: the worker OK, the dead rank hidden, no restart).

The rounds are counted, not slept: ``dgxdoctor_check_runs_total`` of the worker's vllm_executor and of the head's
peer_compare. About 10 s each.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import PORT, Cluster, Node, wait_for
from harness.namespaces import Spawned

pytestmark = pytest.mark.integration

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
WORKER_URL = f"http://dgx-b:{PORT}"
MP_RESTART = [
    "dgx-a: stop vllm-head-mp.service",
    "dgx-b: stop vllm-worker-mp.service",
    "dgx-b: start vllm-worker-mp.service",
    "dgx-a: start vllm-head-mp.service",
]
ROUNDS = 4  # the head's comparisons of the worker's state that must pass with nothing run


def codes(node: Node, check: str) -> dict[str, str]:
    return {f["code"]: f["status"] for f in node.findings(check)}


def runs(node: Node, check: str) -> float:
    return node.sample("dgxdoctor_check_runs_total", check=check) or 0.0


def title_of(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


FORGED: list[Spawned] = []  # this test's look-alikes: ended before the nodes are


def forge(node: Node, title: str, stop: bool) -> Spawned:
    """nobody runs ``exec -a TITLE sleep 600`` inside ``node`` (and stops it), as any local user can."""
    forged = node.ns.spawn([*NOBODY, "bash", "-c", f"exec -a {title} sleep 600"])
    FORGED.append(forged)
    wait_for(f"nobody's {title}", lambda: title_of(forged.pid).startswith(title.encode()), 10, node)
    assert os.stat(f"/proc/{forged.pid}").st_uid == 65534
    if stop:
        os.kill(forged.pid, signal.SIGSTOP)
        state = lambda: Path(f"/proc/{forged.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # noqa: E731
        wait_for("the look-alike stopped (T)", lambda: state() == "T", 10, node)
    return forged


def rank_pid(node: Node, title: str) -> int:
    """The pid (the host's numbering) of root's rank ``title`` inside ``node``."""
    (pid,) = [
        p for p in node.ns.pids() if title_of(p).startswith(f"{title}\0".encode()) and os.stat(f"/proc/{p}").st_uid == 0
    ]
    return pid


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Both serving units up (the stand-ins), the worker's agent OK for vllm_executor, the head's comparing."""
    with Cluster({"dgx-a": "head", "dgx-b": "worker"}) as cluster:
        head, worker = cluster["dgx-a"], cluster["dgx-b"]
        for node in (head, worker):
            node.install_nccl_env(VLLM_HOST_IP=node.ip)
        cluster.start_unit(head, "vllm-head-mp.service", HEAD_ADDR=head.ip)
        cluster.start_unit(worker, "vllm-worker-mp.service", HEAD_ADDR=head.ip)
        remediation = {"mode": "act", "hold_s": 0, "vllm_start_grace_s": 0, "drain": False}
        worker.configure(extra={"checks.vllm_executor": {"interval_s": 1.0}, "remediation": remediation},
                         only=("vllm_executor",), node={"executor": "mp"})  # fmt: skip
        worker.start_daemon()
        worker.wait_for("the worker OK", lambda: worker.checks()["vllm_executor"]["status"] == "ok", 30)
        assert codes(worker, "vllm_executor") == {}
        argv = {verb: ["systemctl", verb, "vllm-head-mp.service"] for verb in ("stop", "start")}
        head.configure(extra={
            "daemon": {"peer_timeout_s": 2.0},
            "remediation": {**remediation, "verify_timeout_s": 10,
                            "cooldown_s": {"restart_vllm": 3600.0, "restart_cluster": 3600.0, "page": 0.0}},
            "remediation.commands": {"stop_vllm": argv["stop"], "start_vllm": argv["start"]},
            "checks.peer_compare": {"interval_s": 1.0},
            "checks.vllm": {"enabled": False, "served_model_name": "glm-5.3"},
        }, only=("peer_compare",), node={"executor": "mp"})  # fmt: skip
        head.start_daemon()
        head.wait_for("the head comparing", lambda: "1/1 peer(s) answered" in head.checks()["peer_compare"]["summary"],
                      30, worker)  # fmt: skip
        try:
            yield cluster
        finally:
            end_forged()


def end_forged() -> None:
    """Each look-alike killed, then its ``nsenter`` continued: nsenter stops itself when its child stops (and would
    continue the child when continued), so a stopped look-alike leaves it stopped, never reaping."""
    while FORGED:
        forged = FORGED.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(forged.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(forged.outer.pid, signal.SIGCONT)
        forged.outer.wait(10)


def after_two_runs(node: Node, check: str) -> None:
    """Wait for two more runs of ``check`` on ``node``: the second lists the processes as they are now."""
    since = runs(node, check)
    node.wait_for(f"two more runs of {check}", lambda: runs(node, check) >= since + 2, 30)


def test_a_stopped_rank_lookalike_of_nobody_restarts_nothing(cluster: Cluster) -> None:
    head, worker = cluster["dgx-a"], cluster["dgx-b"]
    forge(worker, "VLLM::Worker_TP9", stop=True)  # the title of a live rank of this worker
    after_two_runs(worker, "vllm_executor")
    # From here every comparison of the head fetches a worker state made after the forgery: ROUNDS of them.
    since, seen = runs(head, "peer_compare"), set()

    def compared() -> bool:
        seen.update(codes(head, "peer_compare"))
        return runs(head, "peer_compare") >= since + ROUNDS

    head.wait_for(f"{ROUNDS} more comparisons", compared, 30, worker)
    assert cluster.systemctl_calls() == []
    assert [r for r in head.audit() if r["event"] in ("decision", "action_started", "action")] == []
    assert [r for r in worker.audit() if r["event"] == "step"] == []
    summary = head.checks()["peer_compare"]["summary"]
    assert seen == set() and "1/1 peer(s) answered" in summary, (seen, summary)
    # The worker: OK, the look-alike named and counted, never judged.
    check = worker.checks()["vllm_executor"]
    assert check["status"] == "ok" and codes(worker, "vllm_executor") == {"VLLM_LOOKALIKES_IGNORED": "ok"}, check
    assert "VLLM::Worker_TP9 (uid 65534" in check["findings"][0]["message"]
    assert worker.sample("dgxdoctor_vllm_lookalikes_ignored", reason="owner") == 1.0


def test_a_dead_rank_behind_nobodys_lookalikes_gets_the_mp_cluster_restart(cluster: Cluster) -> None:
    head, worker = cluster["dgx-a"], cluster["dgx-b"]
    # nobody's ranks first (the dead rank's own title, and one more), then the real rank dies: no run of the worker's
    # check ever sees the rank gone without the look-alikes beside it.
    forge(worker, "VLLM::Worker_TP11", stop=False)
    forge(worker, "VLLM::Worker_TP3", stop=False)
    after_two_runs(worker, "vllm_executor")
    assert worker.checks()["vllm_executor"]["status"] == "ok" and cluster.systemctl_calls() == []
    os.kill(rank_pid(worker, "VLLM::Worker_TP11"), signal.SIGKILL)
    after_two_runs(worker, "vllm_executor")
    check = worker.checks()["vllm_executor"]  # the processes as the forgeries left them (the fake restarts nothing)
    head.wait_for("the head's action", lambda: [r for r in head.audit() if r["event"] == "action"], 30, worker)
    (action,) = [r for r in head.audit() if r["event"] == "action"]
    assert (action["action"], action["outcome"]) == ("restart_cluster", "success"), action
    assert action["seen"].startswith("PEER_MP_WORKER_DOWN dgx-b: "), action
    assert [s["step"] for s in action["steps"]] == ["stop:stop_vllm", f"stop:vllm_stop@{WORKER_URL}",
                                                    f"vllm_start@{WORKER_URL}", "start_vllm", "verify"]  # fmt: skip
    # The rank stays dead (the fake systemctl restarts nothing): more comparisons, and still that one restart.
    since = runs(head, "peer_compare")
    head.wait_for("more comparisons", lambda: runs(head, "peer_compare") >= since + 2, 30, worker)
    assert cluster.systemctl_calls() == MP_RESTART
    assert [(r["step"], r["requested_by"]) for r in worker.audit() if r["event"] == "step"] == [
        ("vllm_stop", "head"),
        ("vllm_start", "head"),
    ]
    # The worker: CRITICAL for the dead rank, the two look-alikes named, not counted as ranks.
    assert check["status"] == "critical", check
    found = {f["code"]: f for f in check["findings"]}
    assert found.keys() == {"VLLM_MP_WORKERS_MISSING", "VLLM_LOOKALIKES_IGNORED"}, found
    assert "7 of 8 VLLM::Worker processes" in found["VLLM_MP_WORKERS_MISSING"]["message"], found
    ignored = found["VLLM_LOOKALIKES_IGNORED"]["message"]
    assert "VLLM::Worker_TP11 (uid 65534" in ignored and "VLLM::Worker_TP3 (uid 65534" in ignored, ignored

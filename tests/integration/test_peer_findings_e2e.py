"""A worker's findings decide the head's action, end to end, on the multi-node harness (tests/harness): "dgx-a" the
head, "dgx-b" a worker of vLLM's multiprocessing executor across nodes, each in its own network and PID namespace,
installed as the README says (the same token file), act mode, and each node's fake ``systemctl`` recording every
call (the cluster's log keeps the order across both).

The worker's own checks make its findings from its own inputs: its PID namespace holds no headless vLLM, which gives
``VLLM_MP_HEADLESS_MISSING``; its kernel log (a private file) an XID 79. The head fetches the worker's ``/state``
over HTTP, validates it (fleet/peers.py) and compares: ``PEER_MP_WORKER_DOWN`` becomes the mp cluster restart
docs/remediation.md promises (head stop, worker stop and start through the step API, head start, verification
against the head's vLLM stand-in); with the XID, ``PEER_HARDWARE_FAULT`` makes the hardware gate refuse that
restart naming the worker's XID, and nothing runs. With the GPUs through NVML's seam (tests/faults/agent.py, the
H200 capture at a set utilisation) and the worker's vllm check watching the head's stalled vLLM stand-in, the head
names the worker's rank as stopped (``PEER_TP_RANK_STOPPED``). Before the fix (issue 34) the head saw "1/1 peer(s)
answered ... 0 difference(s)" and did nothing. 10-20 s each.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import PORT, Cluster, Node

pytestmark = pytest.mark.integration

BUS = "0000:3b:00"
XID_79 = f"NVRM: Xid (PCI:{BUS}): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
AGENT = Path(__file__).resolve().parents[1] / "faults" / "agent.py"  # the daemon with the NVML capture
WORKER_URL = f"http://dgx-b:{PORT}"  # the head's peer, as the README writes it
MP_RESTART = [
    "dgx-a: stop vllm-head-mp.service",
    "dgx-b: stop vllm-worker-mp.service",
    "dgx-b: start vllm-worker-mp.service",
    "dgx-a: start vllm-head-mp.service",
]


def check(node: Node, name: str) -> dict[str, Any]:
    return node.checks().get(name, {"findings": []})  # not run yet: no findings


def codes(node: Node, name: str) -> set[str]:
    return {f["code"] for f in check(node, name)["findings"]}


class Pair:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.head_node, self.worker_node = cluster["dgx-a"], cluster["dgx-b"]

    def worker(self, kernel_lines: tuple[str, ...] = (), gpu_util: int | None = None) -> Node:
        """dgx-b: an mp worker with no headless vLLM, its kernel log holding ``kernel_lines``. With ``gpu_util``, a
        worker of any executor (none declared): its GPUs (the NVML capture) at that utilisation, and its vllm check
        watching the head's API server (a stand-in, stalled)."""
        node = self.worker_node
        node.kmsg.write_text("".join(f"{line}\n" for line in kernel_lines))
        remediation = {"mode": "act", "hold_s": 0, "vllm_start_grace_s": 0, "drain": False}
        if gpu_util is None:
            tables: dict[str, dict[str, Any]] = {"checks.vllm_executor": {"interval_s": 1.0},
                                                 "checks.xid": {"interval_s": 1.0}}  # fmt: skip
            node.configure(extra={**tables, "remediation": remediation}, only=("vllm_executor", "xid"),
                           node={"executor": "mp"})  # fmt: skip
        else:
            vllm = {"interval_s": 1.0, "base_url": "http://dgx-a:8000", "canary": "never", "progress_poll_s": 0.5}
            node.configure(extra={"checks.gpu": {"interval_s": 1.0}, "checks.vllm": vllm, "remediation": remediation},
                           only=("gpu", "vllm"))  # fmt: skip
        return self._start(node, gpu_util)

    def head(self, gpu_util: int | None = None) -> Node:
        """dgx-a: the mp head in act mode, its peer the worker; its peer comparison runs (and its GPU check, at
        ``gpu_util``, when given)."""
        node = self.head_node
        argv = {verb: ["systemctl", verb, "vllm-head-mp.service"] for verb in ("stop", "start")}
        extra: dict[str, dict[str, Any]] = {
            "daemon": {"peer_timeout_s": 2.0},
            "remediation": {"mode": "act", "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 10, "drain": False,
                            "cooldown_s": {"restart_vllm": 3600.0, "restart_cluster": 3600.0, "page": 0.0}},
            "remediation.commands": {"stop_vllm": argv["stop"], "start_vllm": argv["start"]},
            "checks.peer_compare": {"interval_s": 1.0},
            "checks.vllm": {"enabled": False, "served_model_name": "tiny"},
        }  # fmt: skip
        keep = ["peer_compare"]
        if gpu_util is not None:
            extra["checks.gpu"] = {"interval_s": 1.0}
            keep.append("gpu")
        node.configure(extra=extra, only=keep, node={"executor": "mp"})
        return self._start(node, gpu_util)

    @staticmethod
    def _start(node: Node, gpu_util: int | None) -> Node:
        if gpu_util is None:
            node.start_daemon()
        else:  # the GPUs through NVML's seam: the H200 capture at that utilisation
            env = {"PYTHONPATH": f"{AGENT.parents[1]}:{AGENT.parents[2] / 'src'}", "DGXDOCTOR_NVML_UTIL": str(gpu_util)}
            node.start_daemon(program=[sys.executable, str(AGENT)], env=env)
        return node


@pytest.fixture
def pair() -> Iterator[Pair]:
    with Cluster({"dgx-a": "head", "dgx-b": "worker"}) as cluster:
        yield Pair(cluster)


def test_a_worker_without_its_headless_vllm_gets_the_mp_cluster_restart(pair: Pair) -> None:
    worker = pair.worker()
    worker.wait_for("the worker's finding", lambda: "VLLM_MP_HEADLESS_MISSING" in codes(worker, "vllm_executor"), 30)
    pair.cluster.start_vllm(pair.head_node, "--port", "8000")  # the head's API server, for the verification
    head = pair.head()
    head.wait_for("PEER_MP_WORKER_DOWN at the head", lambda: "PEER_MP_WORKER_DOWN" in codes(head, "peer_compare"), 30)
    down = next(f for f in check(head, "peer_compare")["findings"] if f["code"] == "PEER_MP_WORKER_DOWN")
    assert down["status"] == "critical" and down["subject"] == "dgx-b" and down["remedy"], down
    assert "no headless vLLM process on this worker node" in down["message"]

    head.wait_for("the head's action", lambda: [r for r in head.audit() if r["event"] == "action"], 60, worker)
    (action,) = [r for r in head.audit() if r["event"] == "action"]
    assert (action["action"], action["outcome"]) == ("restart_cluster", "success"), action
    assert action["seen"].startswith("PEER_MP_WORKER_DOWN dgx-b: "), action
    assert [s["step"] for s in action["steps"]] == ["stop:stop_vllm", f"stop:vllm_stop@{WORKER_URL}",
                                                    f"vllm_start@{WORKER_URL}", "start_vllm", "verify"]  # fmt: skip
    assert pair.cluster.systemctl_calls() == MP_RESTART  # exactly the documented order, head and worker alike
    steps = [(r["step"], r["requested_by"]) for r in worker.audit() if r["event"] == "step"]
    assert steps == [("vllm_stop", "head"), ("vllm_start", "head")]


def test_a_workers_xid_79_refuses_the_restart_naming_it(pair: Pair) -> None:
    worker = pair.worker((XID_79,))
    worker.wait_for("the mp finding", lambda: {"VLLM_MP_HEADLESS_MISSING"} <= codes(worker, "vllm_executor"), 30)
    worker.wait_for("the worker's XID 79", lambda: "XID_79" in codes(worker, "xid"), 30)
    xid = next(f for f in check(worker, "xid")["findings"] if f["code"] == "XID_79")
    assert xid["evidence"] == XID_79  # the kernel's line travels with the finding
    head = pair.head()
    head.wait_for("both peer findings at the head", lambda: {"PEER_MP_WORKER_DOWN", "PEER_HARDWARE_FAULT"} <=
                  codes(head, "peer_compare"), 30)  # fmt: skip
    fault = next(f for f in check(head, "peer_compare")["findings"] if f["code"] == "PEER_HARDWARE_FAULT")
    assert fault["message"] == f"XID 79 on {BUS} of dgx-b", fault

    def refused() -> list[dict[str, Any]]:
        return [r for r in head.audit() if r["event"] == "decision" and r["verdict"] == "refuse"]

    head.wait_for("the refusal", refused, 30)
    reason = refused()[0]["reason"]
    assert reason.startswith("a restart cannot help: ") and f"cause: XID 79 on {BUS} of dgx-b" in reason, reason
    assert "(PEER_HARDWARE_FAULT)" in reason and refused()[0]["action"] == "restart_cluster"
    head.wait_for("the page", lambda: [r for r in head.audit() if r["event"] == "page"], 30)
    time.sleep(3)  # more evaluations: still nothing runs
    assert pair.cluster.systemctl_calls() == []
    assert not [r for r in head.audit() if r["event"] in ("action_started", "action")]


def test_a_worker_rank_stopped_under_a_stalled_engine_arrives_at_the_head(pair: Pair) -> None:
    """The worker's vllm check sees the head's engine stalled and its own GPUs idle while the head's spin in the
    collective: the head names the worker's rank as the stopped one (no action: it is a pointer for a person)."""
    pair.cluster.start_vllm(pair.head_node, "--port", "8000", stalled=True)
    worker = pair.worker(gpu_util=0)
    worker.wait_for("the stall", lambda: codes(worker, "vllm") & {"ENGINE_NO_PROGRESS", "ENGINE_HUNG"}, 30)
    head = pair.head(gpu_util=100)
    head.wait_for("PEER_TP_RANK_STOPPED", lambda: "PEER_TP_RANK_STOPPED" in codes(head, "peer_compare"), 30)
    stopped = next(f for f in check(head, "peer_compare")["findings"] if f["code"] == "PEER_TP_RANK_STOPPED")
    assert stopped["status"] == "critical" and stopped["subject"] == "dgx-b", stopped
    assert "vLLM's engine is stalled (dgx-b): dgx-b's GPUs are idle (0%) while dgx-a 100% spin" in stopped["message"]
    assert pair.cluster.systemctl_calls() == []

"""A worker's findings decide the head's action, end to end: two real ``dgxdoctor run`` daemons on loopback ("dgx-a"
the head, "dgx-b" a worker of vLLM's multiprocessing executor across nodes), a shared token, act mode, and a fake
``systemctl`` first on both daemons' PATH recording every call in one file (in call order).

The worker's own checks make its findings from its own inputs: its procfs (an empty private proc root: no headless
vLLM process) gives ``VLLM_MP_HEADLESS_MISSING``, its kernel log (a private file) an XID 79. The head fetches the
worker's ``/state`` over HTTP, validates it (fleet/peers.py) and compares: ``PEER_MP_WORKER_DOWN`` becomes the mp
cluster restart docs/remediation.md promises (head stop, worker stop and start through the step API, head start,
verification against a vLLM stand-in); with the XID, ``PEER_HARDWARE_FAULT`` makes the hardware gate refuse that
restart naming the worker's XID, and nothing runs. With the GPUs through NVML's seam (tests/faults/agent.py, the
H200 capture at a set utilisation) and the worker's vllm check watching a stalled vLLM stand-in, the head names the
worker's rank as stopped (``PEER_TP_RANK_STOPPED``). Before the fix (issue 34) the head saw "1/1 peer(s) answered
... 0 difference(s)" and did nothing. 5-15 s each, no root needed.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemonproc import DaemonProc
from dgxdoctor.checks.registry import ALL_CHECKS

pytestmark = pytest.mark.integration

TOKEN = "peer-findings-e2e-token-0123456789"
BUS = "0000:3b:00"
XID_79 = f"NVRM: Xid (PCI:{BUS}): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
# Requests in flight and no counter moving: the engine makes no step (what a stopped rank does to every rank).
STALLED_METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="tiny"} 4.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0\n'
    "# TYPE vllm:generation_tokens_total counter\n"
    'vllm:generation_tokens_total{engine="0",model_name="tiny"} 1200.0\n'
)
AGENT = Path(__file__).resolve().parents[1] / "faults" / "agent.py"  # the daemon with the NVML capture
MP_RESTART = [
    "stop vllm-head-mp.service",
    "stop vllm-worker-mp.service",
    "start vllm-worker-mp.service",
    "start vllm-head-mp.service",
]


class VllmStandIn(http.server.BaseHTTPRequestHandler):
    """The head's vLLM as the restart's verification asks it: healthy, "tiny" listed, a completion with tokens."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send({})
        elif self.path == "/v1/models":
            self._send({"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        elif self.path == "/metrics":
            self._send_text(STALLED_METRICS)
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/chat/completions":
            self._send({"choices": [{"message": {"content": "OK"}}], "usage": {"completion_tokens": 1}})
        else:
            self.send_error(404)

    def _send(self, doc: dict[str, Any]) -> None:
        self._send_text(json.dumps(doc), "application/json")

    def _send_text(self, text: str, kind: str = "text/plain; version=0.0.4") -> None:
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def quiet(*keep: str) -> str:
    return "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name not in keep)


def fake_systemctl(root: Path) -> Path:
    """``systemctl VERB UNIT`` recorded, one line per call, and successful; shared by both daemons."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {root / "systemctl.calls"}\n')
    script.chmod(0o755)
    return bin_dir


def calls(root: Path) -> list[str]:
    path = root / "systemctl.calls"
    return path.read_text().splitlines() if path.exists() else []


def audit(node: DaemonProc) -> list[dict[str, Any]]:
    path = node.workdir / "state" / "remediation.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check(node: DaemonProc, name: str) -> dict[str, Any]:
    doc = node.get("/state", auth=True).json()
    found: dict[str, Any] = next((c for c in doc["checks"] if c["name"] == name), {"findings": []})  # not run yet
    return found


def codes(node: DaemonProc, name: str) -> set[str]:
    return {f["code"] for f in check(node, name)["findings"]}


class Pair:
    def __init__(self, root: Path, vllm_url: str) -> None:
        self.root = root
        self.vllm_url = vllm_url
        self.path = {"PATH": f"{fake_systemctl(root)}:{os.environ['PATH']}"}
        self.procs: list[DaemonProc] = []

    def worker(self, kernel_lines: tuple[str, ...] = (), gpu_util: int | None = None) -> DaemonProc:
        """dgx-b: an mp worker with no headless vLLM (its proc root is empty), its kernel log holding ``lines``.
        With ``gpu_util``, a worker of any executor (none declared): its GPUs (the NVML capture) at that
        utilisation, and its vllm check watching the head's API server (the stand-in, stalled)."""
        work = self.root / "dgx-b"
        (work / "proc").mkdir(parents=True)
        kmsg = work / "kmsg"
        kmsg.write_text("".join(f"{line}\n" for line in kernel_lines))
        executor = 'executor = "mp"\n'  # the tensor-parallel stall below is any executor's: none declared there
        if gpu_util is None:
            checks = "[checks.vllm_executor]\ninterval_s = 1.0\n[checks.xid]\ninterval_s = 1.0\n"
            keep: tuple[str, ...] = ("vllm_executor", "xid")
        else:
            executor = ""
            checks = (f'[checks.gpu]\ninterval_s = 1.0\n[checks.vllm]\ninterval_s = 1.0\nbase_url = "{self.vllm_url}"\n'
                      'canary = "never"\nprogress_poll_s = 0.5\n')  # fmt: skip
            keep = ("gpu", "vllm")
        body = (
            f'[node]\nname = "dgx-b"\nrole = "worker"\n{executor}'
            f'[paths]\nstate_dir = "{work / "state"}"\nproc_root = "{work / "proc"}"\nkmsg_path = "{kmsg}"\n'
            f'[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\n'
            f'[remediation]\nmode = "act"\nhold_s = 0\nvllm_start_grace_s = 0\n'
            f"{checks}{quiet(*keep)}"
        )
        return self._start(DaemonProc(work, body, token=TOKEN, env=self.path), gpu_util)

    def head(self, worker: DaemonProc, gpu_util: int | None = None) -> DaemonProc:
        """dgx-a: the mp head in act mode, its peer the worker; its peer comparison runs (and its GPU check, at
        ``gpu_util``, when given)."""
        work = self.root / "dgx-a"
        kmsg = work / "kmsg"
        work.mkdir(parents=True)
        kmsg.write_text("")
        argv = {verb: ["systemctl", verb, "vllm-head-mp.service"] for verb in ("stop", "start")}
        gpu = "[checks.gpu]\ninterval_s = 1.0\n" if gpu_util is not None else ""
        body = (
            f'[node]\nname = "dgx-a"\nrole = "head"\nexecutor = "mp"\n'
            f'[paths]\nstate_dir = "{work / "state"}"\nkmsg_path = "{kmsg}"\n'
            f'[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\npeers = ["{worker.url}"]\npeer_timeout_s = 2.0\n'
            f'[remediation]\nmode = "act"\nhold_s = 0\nvllm_start_grace_s = 0\nverify_timeout_s = 10\n'
            f"cooldown_s = {{restart_vllm = 3600.0, restart_cluster = 3600.0, page = 0.0}}\n"
            f"[remediation.commands]\nstop_vllm = {json.dumps(argv['stop'])}\n"
            f"start_vllm = {json.dumps(argv['start'])}\n"
            f"[checks.peer_compare]\ninterval_s = 1.0\n{gpu}"
            f'[checks.vllm]\nenabled = false\nbase_url = "{self.vllm_url}"\nserved_model_name = "tiny"\n'
            f"{quiet('peer_compare', 'vllm', *(('gpu',) if gpu else ()))}"
        )
        return self._start(DaemonProc(work, body, token=TOKEN, env=self.path), gpu_util)

    def _start(self, proc: DaemonProc, gpu_util: int | None) -> DaemonProc:
        if gpu_util is not None:  # the GPUs through NVML's seam: the H200 capture at that utilisation
            proc.program = (str(AGENT),)
            proc.env = {**proc.env, "PYTHONPATH": f"{AGENT.parents[1]}:{AGENT.parents[2] / 'src'}",
                        "DGXDOCTOR_NVML_UTIL": str(gpu_util)}  # fmt: skip
        self.procs.append(proc)
        proc.start().wait_healthy()
        return proc


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), VllmStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    made = Pair(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield made
    finally:
        for proc in made.procs:
            proc.stop()
        server.shutdown()
        server.server_close()


def test_a_worker_without_its_headless_vllm_gets_the_mp_cluster_restart(pair: Pair) -> None:
    worker = pair.worker()
    worker.wait_for(lambda: "VLLM_MP_HEADLESS_MISSING" in codes(worker, "vllm_executor"), 30, "the worker's finding")
    head = pair.head(worker)
    head.wait_for(lambda: "PEER_MP_WORKER_DOWN" in codes(head, "peer_compare"), 30, "PEER_MP_WORKER_DOWN at the head")
    down = next(f for f in check(head, "peer_compare")["findings"] if f["code"] == "PEER_MP_WORKER_DOWN")
    assert down["status"] == "critical" and down["subject"] == "dgx-b" and down["remedy"], down
    assert "no headless vLLM process on this worker node" in down["message"]

    head.wait_for(lambda: [r for r in audit(head) if r["event"] == "action"], 60, "the head's action")
    (action,) = [r for r in audit(head) if r["event"] == "action"]
    assert (action["action"], action["outcome"]) == ("restart_cluster", "success"), action
    assert action["seen"].startswith("PEER_MP_WORKER_DOWN dgx-b: "), action
    assert [s["step"] for s in action["steps"]] == ["stop:stop_vllm", f"stop:vllm_stop@{worker.url}",
                                                    f"vllm_start@{worker.url}", "start_vllm", "verify"]  # fmt: skip
    assert calls(pair.root) == MP_RESTART  # exactly the documented order, head and worker alike
    steps = [(r["step"], r["requested_by"]) for r in audit(worker) if r["event"] == "step"]
    assert steps == [("vllm_stop", "head"), ("vllm_start", "head")]


def test_a_workers_xid_79_refuses_the_restart_naming_it(pair: Pair) -> None:
    worker = pair.worker((XID_79,))
    worker.wait_for(lambda: {"VLLM_MP_HEADLESS_MISSING"} <= codes(worker, "vllm_executor"), 30, "the mp finding")
    worker.wait_for(lambda: "XID_79" in codes(worker, "xid"), 30, "the worker's XID 79")
    xid = next(f for f in check(worker, "xid")["findings"] if f["code"] == "XID_79")
    assert xid["evidence"] == XID_79  # the kernel's line travels with the finding
    head = pair.head(worker)
    head.wait_for(lambda: {"PEER_MP_WORKER_DOWN", "PEER_HARDWARE_FAULT"} <= codes(head, "peer_compare"), 30,
                  "both peer findings at the head")  # fmt: skip
    fault = next(f for f in check(head, "peer_compare")["findings"] if f["code"] == "PEER_HARDWARE_FAULT")
    assert fault["message"] == f"XID 79 on {BUS} of dgx-b", fault

    def refused() -> list[dict[str, Any]]:
        return [r for r in audit(head) if r["event"] == "decision" and r["verdict"] == "refuse"]

    head.wait_for(lambda: refused(), 30, "the refusal")
    reason = refused()[0]["reason"]
    assert reason.startswith("a restart cannot help: ") and f"cause: XID 79 on {BUS} of dgx-b" in reason, reason
    assert "(PEER_HARDWARE_FAULT)" in reason and refused()[0]["action"] == "restart_cluster"
    head.wait_for(lambda: [r for r in audit(head) if r["event"] == "page"], 30, "the page")
    time.sleep(3)  # more evaluations: still nothing runs
    assert calls(pair.root) == []
    assert not [r for r in audit(head) if r["event"] in ("action_started", "action")]


def test_a_worker_rank_stopped_under_a_stalled_engine_arrives_at_the_head(pair: Pair) -> None:
    """The worker's vllm check sees the head's engine stalled and its own GPUs idle while the head's spin in the
    collective: the head names the worker's rank as the stopped one (no action: it is a pointer for a person)."""
    worker = pair.worker(gpu_util=0)
    worker.wait_for(lambda: codes(worker, "vllm") & {"ENGINE_NO_PROGRESS", "ENGINE_HUNG"}, 30, "the stall")
    head = pair.head(worker, gpu_util=100)
    head.wait_for(lambda: "PEER_TP_RANK_STOPPED" in codes(head, "peer_compare"), 30, "PEER_TP_RANK_STOPPED")
    stopped = next(f for f in check(head, "peer_compare")["findings"] if f["code"] == "PEER_TP_RANK_STOPPED")
    assert stopped["status"] == "critical" and stopped["subject"] == "dgx-b", stopped
    assert "vLLM's engine is stalled (dgx-b): dgx-b's GPUs are idle (0%) while dgx-a 100% spin" in stopped["message"]
    assert calls(pair.root) == []

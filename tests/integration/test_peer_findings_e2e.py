"""A worker's findings decide the head's action, end to end: two real ``dgxdoctor run`` daemons on loopback ("dgx-a"
the head, "dgx-b" a worker of vLLM's multiprocessing executor across nodes), a shared token, act mode, and a fake
``systemctl`` first on both daemons' PATH recording every call in one file (in call order).

The worker's own checks make its findings from its own inputs: its procfs (an empty private proc root: no headless
vLLM process) gives ``VLLM_MP_HEADLESS_MISSING``, its kernel log (a private file) an XID 79. The head fetches the
worker's ``/state`` over HTTP, validates it (fleet/peers.py) and compares: ``PEER_MP_WORKER_DOWN`` becomes the mp
cluster restart docs/remediation.md promises (head stop, worker stop and start through the step API, head start,
verification against a vLLM stand-in); with the XID, ``PEER_HARDWARE_FAULT`` makes the hardware gate refuse that
restart naming the worker's XID, and nothing runs. Before the fix (issue 34) the head saw "1/1 peer(s) answered ...
0 difference(s)" and did nothing. A few seconds each, no root needed.
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
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/chat/completions":
            self._send({"choices": [{"message": {"content": "OK"}}], "usage": {"completion_tokens": 1}})
        else:
            self.send_error(404)

    def _send(self, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
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

    def worker(self, kernel_lines: tuple[str, ...] = ()) -> DaemonProc:
        """dgx-b: an mp worker with no headless vLLM (its proc root is empty), its kernel log holding ``lines``."""
        work = self.root / "dgx-b"
        (work / "proc").mkdir(parents=True)
        kmsg = work / "kmsg"
        kmsg.write_text("".join(f"{line}\n" for line in kernel_lines))
        body = (
            f'[node]\nname = "dgx-b"\nrole = "worker"\nexecutor = "mp"\n'
            f'[paths]\nstate_dir = "{work / "state"}"\nproc_root = "{work / "proc"}"\nkmsg_path = "{kmsg}"\n'
            f'[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\n'
            f'[remediation]\nmode = "act"\nhold_s = 0\nvllm_start_grace_s = 0\n'
            f"[checks.vllm_executor]\ninterval_s = 1.0\n[checks.xid]\ninterval_s = 1.0\n"
            f"{quiet('vllm_executor', 'xid')}"
        )
        return self._start(DaemonProc(work, body, token=TOKEN, env=self.path))

    def head(self, worker: DaemonProc) -> DaemonProc:
        """dgx-a: the mp head in act mode, its peer the worker; only its peer comparison runs."""
        work = self.root / "dgx-a"
        kmsg = work / "kmsg"
        work.mkdir(parents=True)
        kmsg.write_text("")
        argv = {verb: ["systemctl", verb, "vllm-head-mp.service"] for verb in ("stop", "start")}
        body = (
            f'[node]\nname = "dgx-a"\nrole = "head"\nexecutor = "mp"\n'
            f'[paths]\nstate_dir = "{work / "state"}"\nkmsg_path = "{kmsg}"\n'
            f'[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\npeers = ["{worker.url}"]\npeer_timeout_s = 2.0\n'
            f'[remediation]\nmode = "act"\nhold_s = 0\nvllm_start_grace_s = 0\nverify_timeout_s = 10\n'
            f"cooldown_s = {{restart_vllm = 3600.0, restart_cluster = 3600.0, page = 0.0}}\n"
            f"[remediation.commands]\nstop_vllm = {json.dumps(argv['stop'])}\n"
            f"start_vllm = {json.dumps(argv['start'])}\n"
            f"[checks.peer_compare]\ninterval_s = 1.0\n"
            f'[checks.vllm]\nenabled = false\nbase_url = "{self.vllm_url}"\nserved_model_name = "tiny"\n'
            f"{quiet('peer_compare', 'vllm')}"
        )
        return self._start(DaemonProc(work, body, token=TOKEN, env=self.path))

    def _start(self, proc: DaemonProc) -> DaemonProc:
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

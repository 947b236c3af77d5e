"""The restart order of vLLM's multiprocessing executor across nodes, in act mode, with real commands.

A fake ``systemctl`` first on PATH records every call and, for ``vllm-worker-mp.service``, really stops and starts
a stand-in headless process (argv of the console script: ``python .../bin/vllm serve MODEL ... --headless``, the
shape vLLM 0.32.0's systemd-less docs launch). The head asks its worker over the step API: the worker is a second
Remediator whose ``run_step`` answers the head's POST (its argv come from its own config, never from the request).
vLLM's HTTP API is an httpx transport at the HTTP boundary; the end-to-end Ray order stays in
tests/integration/test_remediation_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dgxdoctor.config import RemediationSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.result import CheckResult, Finding, Status
from dgxdoctor.validation import validate

WORKER_URL = "http://dgx-b:9100"
HEADLESS = ["serve", "/models/glm", "--tensor-parallel-size", "16", "--nnodes", "2", "--node-rank", "1",
            "--master-addr", "10.0.0.1", "--master-port", "29501", "--headless"]  # fmt: skip

SYSTEMCTL = """#!/bin/sh
# systemctl VERB UNIT: recorded; vllm-worker-mp.service runs a stand-in headless vLLM (pid in worker.pid)
echo "$1 $2" >> "$DIR/calls"
if [ "$2" = "vllm-worker-mp.service" ]; then
  if [ "$1" = "stop" ] && [ -f "$DIR/worker.pid" ]; then
    kill -CONT "$(cat "$DIR/worker.pid")"; kill -TERM "$(cat "$DIR/worker.pid")"; rm -f "$DIR/worker.pid"
  fi
  if [ "$1" = "start" ]; then
    "$PY" "$DIR/bin/vllm" @ARGV@ > /dev/null 2>&1 &
    echo $! > "$DIR/worker.pid"
  fi
fi
[ "$1 $2" != "$FAIL" ]
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(SYSTEMCTL.replace("@ARGV@", " ".join(HEADLESS)))
    fake.chmod(0o755)
    (bin_dir / "vllm").write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DIR", str(tmp_path))
    monkeypatch.setenv("PY", sys.executable)
    monkeypatch.setenv("FAIL", "")
    yield tmp_path
    pid = tmp_path / "worker.pid"
    if pid.exists():
        os.kill(int(pid.read_text()), signal.SIGKILL)


def signed(step: str, action_id: str) -> dict[str, Any]:
    """A step request as the head sends it (actions.ask_worker): signed with the shared token."""
    import time

    from dgxdoctor.remediation.actions import step_mac

    ts = round(time.time(), 6)
    return {"step": step, "id": action_id, "ts": ts, "mac": step_mac("t" * 16, step, action_id, ts)}


def settings(role: str, **kw: Any) -> RemediationSettings:
    commands = {"stop_vllm": ["systemctl", "stop", "vllm-head-mp.service"],
                "start_vllm": ["systemctl", "start", "vllm-head-mp.service"]}  # fmt: skip
    base = {"mode": "act", "role": role, "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 1, "drain": False}
    return validate(RemediationSettings, {**base, "commands": commands, **kw})


def pair(tmp: Path, seen: list[str], executor: str | None = "mp") -> tuple[Remediator, Remediator]:
    worker = Remediator(settings("worker"), None, "dgx-b", tmp / "worker-state",
                        Targets(VllmTarget("http://x", None), "", 2, 16, (), "t" * 16, executor), dict)  # fmt: skip

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.host}{request.url.path}")
        if request.url.path == "/remediation/step":
            doc = json.loads(request.content)
            status, answer = asyncio.run(worker.run_step(doc))  # the head's step thread, its signed request
            return httpx.Response(status, json=answer)
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "glm-5.3"}]})
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
        return httpx.Response(404)

    down = CheckResult("peer_compare", Status.CRITICAL, "x", (judged(Finding("PEER_MP_WORKER_DOWN", Status.CRITICAL,
                       "dgx-b's headless vLLM is not serving", subject="dgx-b")),))  # fmt: skip
    targets = Targets(VllmTarget("http://dgx-a:8000", "glm-5.3"), "http://ray:8265", 2, 16, (WORKER_URL,),
                      "t" * 16, executor)  # fmt: skip
    head = Remediator(settings("head"), None, "dgx-a", tmp / "head-state", targets, lambda: {"peer_compare": down},
                      env=Environment(node="dgx-a", http_transport=httpx.MockTransport(handle)))  # fmt: skip
    return head, worker


async def settle(r: Remediator) -> None:
    await r.evaluate()
    for _ in range(500):
        if not r.busy.locked() and guard_state_file(r.state_file.path.parent).read().get("in_flight") is None:
            return
        await asyncio.sleep(0.02)


def last_action(state: Path) -> dict[str, Any]:
    return next(e for e in reversed(AuditLog(state).tail(50)) if e["event"] == "action")


async def test_mp_order_restarts_a_stopped_headless_worker_and_verifies(node: Path) -> None:
    seen: list[str] = []
    head, _ = pair(node, seen)
    await asyncio.to_thread(os.system, "systemctl start vllm-worker-mp.service")
    stopped = int((node / "worker.pid").read_text())
    os.kill(stopped, signal.SIGSTOP)  # the stopped headless worker the peer comparison named
    (node / "calls").unlink()
    await settle(head)
    assert (node / "calls").read_text().splitlines() == [
        "stop vllm-head-mp.service",
        "stop vllm-worker-mp.service",
        "start vllm-worker-mp.service",
        "start vllm-head-mp.service",
    ]
    action = last_action(node / "head-state")
    assert action["outcome"] == "success" and action["action"] == "restart_cluster"
    assert [s["step"] for s in action["steps"]] == ["stop:stop_vllm", f"stop:vllm_stop@{WORKER_URL}",
                                                    f"vllm_start@{WORKER_URL}", "start_vllm", "verify"]  # fmt: skip
    assert seen[-3:] == ["GET dgx-a/health", "GET dgx-a/v1/models", "POST dgx-a/v1/chat/completions"]
    assert not any("ray" in s for s in seen)  # no Ray step, no dashboard wait
    fresh = int((node / "worker.pid").read_text())
    assert fresh != stopped and b"--headless" in Path(f"/proc/{fresh}/cmdline").read_bytes()
    worker_steps = [e for e in AuditLog(node / "worker-state").tail(10) if e["event"] == "step"]
    assert [(e["step"], e["argv"][-1], e["requested_by"]) for e in worker_steps] == [
        ("vllm_stop", "vllm-worker-mp.service", "head"),
        ("vllm_start", "vllm-worker-mp.service", "head"),
    ]


async def test_a_worker_that_does_not_start_ends_the_order_before_the_head(node: Path) -> None:
    head, _ = pair(node, [])
    os.environ["FAIL"] = "start vllm-worker-mp.service"
    await settle(head)
    assert (node / "calls").read_text().splitlines() == [
        "stop vllm-head-mp.service",
        "stop vllm-worker-mp.service",
        "start vllm-worker-mp.service",
    ]
    action = last_action(node / "head-state")
    assert action["outcome"] == "failed" and action["verification"] is None


async def test_steps_follow_the_workers_executor(node: Path) -> None:
    """An mp worker runs no Ray step; a Ray worker (executor unset, as before) no headless-vLLM step."""
    _, mp_worker = pair(node, [])
    assert (await mp_worker.run_step(signed("ray_stop", "a" * 12)))[0] == 409
    _, ray_worker = pair(node, [], executor=None)
    status, answer = await ray_worker.run_step(signed("vllm_stop", "b" * 12))
    assert status == 409 and "executor" in answer["detail"]
    assert not (node / "calls").exists()

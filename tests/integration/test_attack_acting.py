"""The acting half under attack, for real: agents on loopback, a fake ``systemctl`` first on their PATH recording
every call, and the attacker an unprivileged user (``setpriv`` to nobody) with curl. Nothing an attacker sends
may make root run a command; a corrupt state file must not take the agent down; a captured step request replayed
must not run twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_cli
from daemonproc import DaemonProc
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.remediation.actions import step_mac
from dgxdoctor.remediation.audit import AUDIT_FILE

TOKEN = "attack-acting-token-0123456789"
NOBODY = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")
JOIN = {"run_id": "0123456789abcdef0123456789abcdef", "master_addr": "127.0.0.1", "master_port": 29555,
        "nnodes": 2, "node_rank": 1, "join_timeout_s": 30, "min_bytes": "0"}  # fmt: skip
VLLM_DOWN = {"alertname": "DgxdoctorVllmDown", "node": "victim", "dgxdoctor_action": "restart_vllm"}
ALERT = {"version": "4", "alerts": [{"status": "firing", "fingerprint": "f1", "startsAt": "2026-12-01T00:00:00Z",
                                     "labels": VLLM_DOWN}]}  # fmt: skip

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("curl") is None,
    reason="needs root, setpriv and curl: the attacker runs as nobody",
)


def fake_systemctl(root: Path) -> Path:
    """``systemctl`` that records its argv (one JSON line per call) and succeeds."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {root / "systemctl.calls"}\n')
    script.chmod(0o755)
    return bin_dir


def calls(root: Path) -> list[str]:
    path = root / "systemctl.calls"
    return path.read_text().splitlines() if path.exists() else []


def audit(root: Path) -> list[dict[str, object]]:
    """The agent's remediation audit (one JSON object per line)."""
    path = root / "state" / AUDIT_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def config(root: Path, daemon: str, remediation: str) -> str:
    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS)
    return (f'node = "victim"\n[paths]\nstate_dir = "{root / "state"}"\n[daemon]\nlisten = "@LISTEN@"\n{daemon}\n'
            f"[remediation]\n{remediation}\nhold_s = 0\nvllm_start_grace_s = 0\n{quiet}")  # fmt: skip


def attacker(url: str, path: str, body: object, headers: tuple[str, ...] = ()) -> int:
    """POST as nobody; the HTTP status."""
    argv = [*NOBODY, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "--max-time", "10",
            "-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]  # fmt: skip
    for header in headers:
        argv += ["-H", header]
    done = subprocess.run([*argv, f"{url}{path}"], capture_output=True, text=True, timeout=30, check=False)
    return int(done.stdout or 0)


def start(root: Path, body: str) -> DaemonProc:
    bin_dir = fake_systemctl(root)
    proc = DaemonProc(root, body, token=TOKEN, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}).start()
    proc.wait_healthy()
    return proc


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[DaemonProc]:
    """A worker in act mode whose state file was corrupted before it started."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "remediation-state.json").write_text('{"breaker": "open"}')
    proc = start(tmp_path, config(tmp_path, f'token = "{TOKEN}"', 'mode = "act"\nrole = "worker"'))
    yield proc
    proc.stop()


def test_a_corrupt_state_file_disables_acting_visibly_until_reset(worker: DaemonProc, tmp_path: Path) -> None:
    assert worker.metric("dgxdoctor_remediation_mode", mode="disabled") == 1.0
    assert worker.metric("dgxdoctor_remediation_mode", mode="act") == 0.0
    assert worker.metric("dgxdoctor_remediation_state_invalid_total") == 1.0
    assert len(list((tmp_path / "state").glob("remediation-state.json.invalid-*"))) == 1
    cfg = str(tmp_path / "config.toml")
    assert run_cli("remediation", "reset", "--config", cfg).returncode == 0
    worker.wait_for(lambda: worker.metric("dgxdoctor_remediation_mode", mode="act") == 1.0, 10, "back in act mode")


def test_steps_nobody_sends_or_replays_never_run(worker: DaemonProc, tmp_path: Path) -> None:
    assert run_cli("remediation", "reset", "--config", str(tmp_path / "config.toml")).returncode == 0
    ts = round(time.time(), 6)
    step = {"step": "ray_stop", "id": "a1b2c3d4e5f6", "ts": ts, "mac": step_mac(TOKEN, "ray_stop", "a1b2c3d4e5f6", ts)}
    assert attacker(worker.url, "/remediation/step", step) == 401  # no token
    assert attacker(worker.url, "/remediation/step", step, ("Authorization: Bearer wrong-0123456789abc",)) == 401
    assert attacker(worker.url, "/nccl/join", JOIN) == 401
    assert attacker(worker.url, "/alertmanager", ALERT) == 401
    assert calls(tmp_path) == []
    auth = (f"Authorization: Bearer {TOKEN}",)
    assert attacker(worker.url, "/remediation/step", step, auth) == 200  # the head's request, once
    assert calls(tmp_path) == ["stop ray-worker.service"]
    assert attacker(worker.url, "/remediation/step", step, auth) == 409  # captured and replayed
    stale = {**step, "id": "0f0f0f0f0f0f", "ts": ts - 3600}
    stale["mac"] = step_mac(TOKEN, "ray_stop", stale["id"], stale["ts"])
    assert attacker(worker.url, "/remediation/step", stale, auth) == 409
    unsigned = {"step": "ray_stop", "id": "0e0e0e0e0e0e"}
    assert attacker(worker.url, "/remediation/step", unsigned, auth) == 400
    assert calls(tmp_path) == ["stop ray-worker.service"]
    assert worker.proc is not None and worker.proc.poll() is None


def test_an_agent_without_a_token_runs_nothing_for_nobody(tmp_path: Path) -> None:
    proc = start(tmp_path, config(tmp_path, "", 'mode = "observe"'))
    try:
        assert attacker(proc.url, "/nccl/join", JOIN) == 403
        assert attacker(proc.url, "/remediation/step", {"step": "ray_stop", "id": "a1b2c3d4e5f6"}) == 403
        # No alert token: the webhook refuses everyone too (it used to queue nobody's alert on loopback).
        assert attacker(proc.url, "/alertmanager", ALERT) == 403
        for path in ("/bundle/part", "/check/run", "/reload"):
            assert attacker(proc.url, path, {}) == 403, path
        assert not [
            r for r in audit(tmp_path) if r.get("source") == "alert" or r["event"] in ("action_started", "action")
        ]
        assert calls(tmp_path) == []
    finally:
        proc.stop()


def test_act_mode_without_a_token_does_not_start(tmp_path: Path) -> None:
    body = config(tmp_path, "", 'mode = "act"\nrole = "head"').replace("@LISTEN@", "127.0.0.1:9")
    (tmp_path / "config.toml").write_text(body)
    done = run_cli("run", "--config", str(tmp_path / "config.toml"), timeout=60)
    assert done.returncode == 78 and "alert_token_file" in done.stderr

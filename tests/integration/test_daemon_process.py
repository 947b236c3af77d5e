"""The real daemon (``python -m dgxdoctor run``) under a notify socket the test owns, as systemd would run it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import REPO

pytestmark = pytest.mark.integration

TOKEN = "integration-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []

    def wait_for(self, wanted: str, limit_s: float = 30.0) -> list[str]:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            self.messages.append(data)
            if wanted in data.split("\n"):
                return self.messages
        raise AssertionError(f"no {wanted} within {limit_s} s; got {self.messages}")


Running = tuple[subprocess.Popen[str], NotifySocket, str, Path]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Running]:
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'node = "it-node"\n[daemon]\nlisten = "127.0.0.1:{port}"\ntoken = "{TOKEN}"\n'
        f'textfile_path = "{tmp_path / "dgxdoctor.prom"}"\ntextfile_interval_s = 0.5\n'
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
    )
    notify = NotifySocket(tmp_path / "notify.sock")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
        "WATCHDOG_USEC": "1000000",  # ping every 0.5 s
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dgxdoctor", "run", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc, notify, f"http://127.0.0.1:{port}", config
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        notify.sock.close()


def test_notify_serve_reload_stop(
    daemon: tuple[subprocess.Popen[str], NotifySocket, str, Path], tmp_path: Path
) -> None:
    proc, notify, url, config = daemon
    notify.wait_for("READY=1")
    notify.wait_for("WATCHDOG=1")

    metrics = httpx.get(f"{url}/metrics", timeout=5)
    assert metrics.status_code == 200
    assert 'dgxdoctor_build_info{node="it-node"' in metrics.text
    assert httpx.get(f"{url}/healthz", timeout=5).json()["healthy"] is True
    assert httpx.get(f"{url}/state", timeout=5).status_code == 401
    state = httpx.get(f"{url}/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    assert state["node"] == "it-node"

    promtool = shutil.which("promtool")
    if promtool:
        done = subprocess.run([promtool, "check", "metrics"], input=metrics.text, capture_output=True, text=True)
        assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr

    # The textfile for node_exporter appears and parses the same way.
    textfile = tmp_path / "dgxdoctor.prom"
    deadline = time.monotonic() + 10
    while not textfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "dgxdoctor_check_status" in textfile.read_text() or "dgxdoctor_build_info" in textfile.read_text()

    # A bad config on SIGHUP is reported and the old one kept: still serving, still the same token.
    good = config.read_text()
    config.write_text(good + "\n[daemon.surprise]\n")
    notify.messages.clear()
    proc.send_signal(signal.SIGHUP)
    notify.wait_for("READY=1")
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    assert httpx.get(f"{url}/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).status_code == 200

    # A good one is applied (the new token is in force at once).
    new_token = "second-token-abcdefghijklmnop"
    config.write_text(good.replace(TOKEN, new_token))
    notify.messages.clear()
    proc.send_signal(signal.SIGHUP)
    notify.wait_for("READY=1")
    assert httpx.get(f"{url}/state", headers={"Authorization": f"Bearer {new_token}"}, timeout=5).status_code == 200

    notify.messages.clear()
    proc.send_signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    # msgspec's own words for the [daemon] table: "unknown field `surprise` - at `$.daemon`"
    assert '"event": "config_reload_rejected"' in out and "surprise" in out and "$.daemon" in out
    assert '"event": "config_reloaded"' in out and '"event": "stopped"' in out
    # One JSON object per line on stdout.
    for line in out.splitlines():
        json.loads(line)


def test_bad_config_at_start_exits_78(tmp_path: Path) -> None:
    from conftest import run_cli

    config = tmp_path / "bad.toml"
    config.write_text('[daemon]\nlisten = "nowhere"\n')
    done = run_cli("run", "--config", str(config), timeout=60)
    assert done.returncode == 78 and "listen: expected HOST:PORT" in done.stderr and "$.daemon" in done.stderr


def test_bad_listen_flag_is_a_usage_error() -> None:
    from conftest import run_cli

    done = run_cli("run", "--listen", "9835", timeout=60)
    assert done.returncode == 64 and "--listen" in done.stderr and "HOST:PORT" in done.stderr


def test_a_stop_during_an_action_ends_it_interrupted_and_exits_cleanly(tmp_path: Path) -> None:
    """SIGTERM while a restart waits for vLLM (its verification polls ``/health`` up to ``verify_timeout_s``): the
    daemon ends the action there, audits it "interrupted" with nothing left in flight, and exits 0. Its thread used
    to outlive the stop: the daemon exited with the action still in flight and its end unaudited, said only at the
    next start (if there is one)."""
    from daemonproc import DaemonProc
    from dgxdoctor.checks.registry import ALL_CHECKS

    restarted = tmp_path / "restarted"
    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name != "vllm")
    body = (f'node = "dgx-a"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n[daemon]\nlisten = "@LISTEN@"\n'
            f'token = "{TOKEN}"\n[bundle]\ncapture_before_restart = false\n'
            f'[remediation]\nmode = "act"\nrole = "head"\nhold_s = 0\nvllm_start_grace_s = 0\ndrain = false\n'
            f'verify_timeout_s = 600\n[remediation.commands]\nrestart_vllm = ["touch", "{restarted}"]\n'
            f'[checks.vllm]\nenabled = false\nbase_url = "http://127.0.0.1:{free_port()}"\n{quiet}')  # fmt: skip
    proc = DaemonProc(tmp_path, body, token=TOKEN).start()
    try:
        proc.wait_healthy()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        labels = {"alertname": "DgxdoctorVllmDown", "node": "dgx-a", "dgxdoctor_action": "restart_vllm"}
        alert = {"status": "firing", "fingerprint": "f1", "startsAt": now, "labels": labels}
        answer = httpx.post(f"{proc.url}/alertmanager", json={"version": "4", "alerts": [alert]},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)  # fmt: skip
        assert answer.status_code == 200, answer.text
        proc.wait_for(restarted.exists, 30, "restart_vllm run")  # now verifying: nothing answers /health
        code, _ = proc.stop(limit_s=30)
    finally:
        proc.kill()
    assert code == 0, proc.log_tail()
    assert "stop_overdue" not in proc.log_text()
    audit = [json.loads(line) for line in (tmp_path / "state" / "remediation.jsonl").read_text().splitlines()]
    assert (audit[-1]["event"], audit[-1]["action"], audit[-1]["outcome"]) == ("action", "restart_vllm", "interrupted")
    assert [s["step"] for s in audit[-1]["steps"]] == ["restart_vllm", "interrupted"]  # cut while verifying
    assert json.loads((tmp_path / "state" / "remediation-state.json").read_text())["in_flight"] is None

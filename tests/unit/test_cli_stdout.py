"""stdout holds only the command's document: `check --json` stays JSON whatever goes wrong."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_cli


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts and never answers: a vLLM whose API server hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    sock.close()


def test_check_json_with_a_hung_check_is_only_json(tmp_path: Path, silent_server: int) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f"""
[checks.vllm]
base_url = "http://127.0.0.1:{silent_server}"
timeout_s = 1.0
request_timeout_s = 30.0
"""
    )
    done = run_cli("check", "--json", "--only", "vllm", "--config", str(config), timeout=60)
    document = json.loads(done.stdout)  # a log line before the JSON fails here
    (vllm,) = [c for c in document["checks"] if c["name"] == "vllm"]
    assert vllm["status"] == "unknown"
    assert done.returncode == 3
    assert "check_stop_skipped" in done.stderr

"""A vLLM started with another --port than base_url's is named as such at once, never "loading" for the grace."""

from __future__ import annotations

import socket
from pathlib import Path

from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from proctree import write_process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_vllm_on_another_port_is_named_not_loading(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    port = free_port()  # nothing listens there
    argv = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "8001"]
    write_process(proc, 4242, "python", argv)
    (proc / "net").mkdir()
    (proc / "uptime").write_text("1000.00 1000.00\n")
    env = Environment(proc_root=proc, role="head")
    result = VllmCheck(VllmSettings(base_url=f"http://127.0.0.1:{port}", startup_grace_s=900), env).run()
    assert result.status is Status.CRITICAL
    text = " ".join(f.message for f in result.findings)
    assert "serves --port 8001" in text and f"not {port}" in text
    assert "loading" not in result.summary

"""vLLM's port taken by another user, for real: vLLM is down and ``nobody`` (``setpriv`` to 65534) listens on the
base_url port (8000 is unprivileged) with an HTTP server that answers like vLLM: ``/health`` 200, ``/v1/models``,
vLLM's own ``/metrics`` page and chat completions with tokens. Once the vllm check believed it: OK on the head,
a dead vLLM hidden. Now the socket's owner decides: the impostor is named, vLLM is dead (or, where it is not
expected, not here), and nothing of the impostor's is asked.

The agent's ``proc_root`` holds ``/proc/stat``, ``/proc/net`` (the kernel's socket table, uid and inode of the
listener) and the impostor's own ``/proc/<pid>`` (a link): other tests on the machine run vLLM-looking processes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli

NOBODY = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv: the impostor is nobody"
    ),
]

# Reads the /metrics page from stdin (up to a line "END"), listens on the port in argv[1], prints "ready", then
# one line per request it receives (the test reads them after).
IMPOSTOR = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
page = "".join(iter(sys.stdin.readline, "END\\n"))
class Answer(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def reply(self, body, kind="application/json"):
        print(self.command, self.path, flush=True)
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/v1/models":
            return self.reply(json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}))
        if self.path == "/metrics":
            return self.reply(page, "text/plain; version=0.0.4")
        self.reply("")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        msg = {"role": "assistant", "content": "OK"}
        self.reply(json.dumps({"choices": [{"index": 0, "message": msg}], "usage": usage}))
server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer)
print("ready", flush=True)
server.serve_forever()
"""


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


@dataclass
class Impostor:
    proc: subprocess.Popen[str]
    port: int
    root: Path  # the agent's proc_root

    def requests(self) -> list[str]:
        """The requests it answered (it is stopped to read them)."""
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=10)
        return [line for line in out.splitlines() if line and line != "ready"]


@pytest.fixture
def impostor(tmp_path: Path, fixtures: Path) -> Iterator[Impostor]:
    port = free_port()
    argv = [*NOBODY, sys.executable, "-c", IMPOSTOR, str(port)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write((fixtures / "vllm" / "metrics-0.32.0-idle.txt").read_text() + "END\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ready"
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").symlink_to("/proc/stat")
    (root / "net").symlink_to("/proc/net")
    (root / str(proc.pid)).symlink_to(f"/proc/{proc.pid}")
    try:
        yield Impostor(proc, port, root)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def check(tmp: Path, imp: Impostor, node: str = "", vllm: str = "") -> tuple[int, dict[str, object]]:
    """``dgxdoctor check --only vllm --json`` with base_url at the impostor's port."""
    config = tmp / "config.toml"
    config.write_text(
        f'[node]\nname = "dgx-a"\n{node}[paths]\nproc_root = "{imp.root}"\nstate_dir = "{tmp / "state"}"\n'
        f'[checks.vllm]\nbase_url = "http://127.0.0.1:{imp.port}"\noneshot_window_s = 0\n{vllm}'
    )
    done = run_cli("check", "--config", str(config), "--only", "vllm", "--json")
    doc = json.loads(done.stdout)
    return done.returncode, next(c for c in doc["checks"] if c["name"] == "vllm")


def held(imp: Impostor) -> str:
    return f"port {imp.port} is held by pid {imp.proc.pid} of uid 65534, not the serving user: not vLLM"


def test_on_the_head_an_impostor_on_the_port_is_a_dead_vllm_and_never_asked(tmp_path: Path, impostor: Impostor) -> None:
    rc, result = check(tmp_path, impostor, node='role = "head"\n')
    findings = {f["code"]: f for f in result["findings"]}  # type: ignore[attr-defined]
    assert (rc, result["status"], list(findings)) == (2, "critical", ["VLLM_DEAD"]), result
    assert held(impostor) in findings["VLLM_DEAD"]["message"]
    assert "the head node ([node] role) must serve it" in findings["VLLM_DEAD"]["message"]
    assert impostor.requests() == []  # neither /health, /v1/models, /metrics nor the canary


def test_required_vllm_with_an_impostor_is_dead(tmp_path: Path, impostor: Impostor) -> None:
    rc, result = check(tmp_path, impostor, vllm="required = true\n")
    assert (rc, result["status"]) == (2, "critical"), result
    assert held(impostor) in result["findings"][0]["message"]  # type: ignore[index]
    assert impostor.requests() == []


def test_where_vllm_is_not_expected_the_impostor_is_no_vllm_here(tmp_path: Path, impostor: Impostor) -> None:
    rc, result = check(tmp_path, impostor)
    assert (rc, result["status"]) == (0, "skipped"), result
    assert held(impostor) in str(result["summary"])
    assert impostor.requests() == []


def test_the_serving_user_s_listener_is_believed(tmp_path: Path, impostor: Impostor) -> None:
    """The owner decides, not the answers: declared as the serving user, the same server is vLLM (and asked)."""
    rc, result = check(tmp_path, impostor, node='role = "head"\nserving_user = "nobody"\n')
    assert (rc, result["status"]) == (0, "ok"), result
    assert "GET /health" in impostor.requests()

"""Which processes are the serving vLLM's: only the API server listening on the configured port and, below it in
the process tree and of its user, the engine processes. Any local user can title a process ``VLLM::EngineCore``
(``exec -a``) and stop it; that once made a healthy engine ENGINE_HUNG and had root restart vLLM, then the
cluster. The attacker runs as ``nobody`` (setpriv) against the real /proc; a copied tree covers the rest."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources import procfs, vllm_api
from proctree import listen, tcp_listen_line, write_process

API_PID, ENGINE_PID = 7538, 7573
NOBODY = 65534
SETPRIV = shutil.which("setpriv")
needs_root = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv")


def page(fixtures: Path, name: str) -> str:
    return (fixtures / "vllm" / f"metrics-0.32.0-{name}.txt").read_text()


def serve(metrics_page: str, health: str = "up") -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health" and health == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics_page)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(200, text="")

    return httpx.MockTransport(answer)


def run_check(proc_root: Path, port: int, transport: httpx.MockTransport, **settings: object) -> CheckResult:
    env = Environment(node="n1", proc_root=proc_root, http_transport=transport, one_shot=True)
    s = VllmSettings(base_url=f"http://127.0.0.1:{port}", canary="never", oneshot_window_s=0, **settings)  # type: ignore[arg-type]
    return VllmCheck(s, env).run()


def codes(result: CheckResult) -> set[str]:
    return {f.code for f in result.findings}


# ----- the attack with real processes ---------------------------------------------------------------------------

SERVER = """
import socket, subprocess, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
engine = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 300"])
print(s.getsockname()[1], engine.pid, flush=True)
sys.stdin.read()
engine.kill()
"""


@pytest.fixture
def real_vllm() -> Iterator[tuple[int, int]]:
    """A listening "API server" (root's, as the unit runs vLLM) with its engine child: (port, engine pid)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    port, engine = (int(x) for x in proc.stdout.readline().split())
    try:
        yield port, engine
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


@pytest.fixture
def stopped_fake_engine() -> Iterator[int]:
    """``nobody`` runs ``exec -a VLLM::EngineCore sleep 300`` and stops it: the pid."""
    assert SETPRIV is not None
    argv = [SETPRIV, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    fake = subprocess.Popen([*argv, "bash", "-c", "exec -a VLLM::EngineCore sleep 300"])
    for _ in range(200):  # until setpriv and bash have exec'd into the titled sleep
        if Path(f"/proc/{fake.pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
            break
        time.sleep(0.01)
    os.kill(fake.pid, signal.SIGSTOP)
    try:
        yield fake.pid
    finally:
        fake.kill()
        fake.wait(timeout=10)


@needs_root
def test_a_stopped_engine_of_nobody_is_not_the_serving_vllms(
    real_vllm: tuple[int, int], stopped_fake_engine: int, fixtures: Path
) -> None:
    port, engine = real_vllm
    result = run_check(Path("/proc"), port, serve(page(fixtures, "idle")))
    assert "ENGINE_HUNG" not in codes(result), result.findings
    assert result.status is Status.OK
    # the real engine is watched: stopped, it is the hung engine, and the evidence names it alone
    os.kill(engine, signal.SIGSTOP)
    try:
        hung = run_check(Path("/proc"), port, serve(page(fixtures, "idle")))
    finally:
        os.kill(engine, signal.SIGCONT)
    finding = next(f for f in hung.findings if f.code == "ENGINE_HUNG")
    assert f"pid {engine})" in (finding.evidence or "") and f"pid {stopped_fake_engine})" not in (
        finding.evidence or ""
    )


@needs_root
def test_the_listener_is_found_from_its_socket(real_vllm: tuple[int, int]) -> None:
    port, engine = real_vllm
    owner = procfs.port_owner(Path("/proc"), port)
    assert owner is not None and owner.cmdline[:2] == (sys.executable, "-c")
    assert engine in {p.pid for p in procfs.descendants(Path("/proc"), owner.pid)}


# ----- a copied tree: the API server, the hang view, the fallback ------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path, fixtures: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(fixtures / "vllm" / "proc", root)
    return root


def test_a_fake_api_server_of_nobody_is_not_the_one_judged_hung(tree: Path) -> None:
    """An older, stopped ``python -m vllm.entrypoints.openai.api_server`` of nobody: the one that listens is judged."""
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "18765"]
    write_process(tree, 100, "python3", argv, state="T", uid=NOBODY, start_ticks=5)
    write_process(tree, 101, "VLLM::EngineCor", ["VLLM::EngineCore"], state="T", uid=NOBODY, ppid=100)
    listen(tree, API_PID, 18765, uid=0)
    found, _ = vllm_api.find_vllm_process(tree, 18765)
    assert found is not None and found.pid == API_PID
    result = run_check(tree, 18765, serve("", health="timeout"))
    message = result.findings[0].message
    assert "the API server was idle" in message and "is stopped" not in message  # 7538's state, not nobody's


def test_an_engine_of_another_user_below_the_api_server_is_not_its_engine(tree: Path, fixtures: Path) -> None:
    listen(tree, API_PID, 18765, uid=0)
    write_process(tree, 200, "VLLM::EngineCor", ["VLLM::EngineCore"], state="T", uid=NOBODY, ppid=ENGINE_PID)
    result = run_check(tree, 18765, serve(page(fixtures, "idle")))
    assert "ENGINE_HUNG" not in codes(result)
    stat = tree / str(ENGINE_PID) / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") T "))
    assert "ENGINE_HUNG" in codes(run_check(tree, 18765, serve(page(fixtures, "idle"))))


def test_with_nothing_listening_only_trusted_users_processes_count(tmp_path: Path, fixtures: Path) -> None:
    """Loading or dead: a vLLM found by its command line must be root's or ours, or nobody's fake reads 'loading'."""
    root = tmp_path / "proc"
    root.mkdir()
    shutil.copy(fixtures / "vllm" / "proc" / "stat", root / "stat")
    write_process(root, 100, "python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"], uid=NOBODY)
    write_process(root, 101, "VLLM::EngineCor", ["VLLM::EngineCore"], uid=NOBODY)
    assert vllm_api.find_vllm_process(root, 8000) == (None, "no vLLM process on this node")
    write_process(root, 102, "python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"], uid=0)
    found, _ = vllm_api.find_vllm_process(root, 8000)
    assert found is not None and found.pid == 102


def test_proc_net_tcp_gives_owner_and_inode() -> None:
    text = "header\n" + tcp_listen_line(0, 18765, 0, 57131) + "   1: 0100007F:1F40 00000000:0000 0A 00000000:0000\n"
    full, cut = procfs.parse_proc_net_tcp(text)
    assert (full.port, full.uid, full.inode) == (18765, 0, 57131)
    assert (cut.port, cut.uid, cut.inode) == (8000, None, None)  # a line cut short keeps what it has

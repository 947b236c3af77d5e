"""`dgxdoctor check --cluster` against `dgxdoctor check`: wall time with 1 and 3 peers (real daemons on loopback).

    PYTHONPATH=src .venv/bin/python benchmarks/cluster_check.py [--runs 3]

Starts 3 `dgxdoctor run` daemons on free loopback ports (the default checks, a kernel log file of their own, one
shared token), then times `check` and `check --cluster` with the first peer and with all three, each the median of
--runs. Prints the ratio to a single node's `check` against the target (at most 1.5x) for one peer, the two-node
deployment; exit 1 on a miss. With three peers all four "nodes" run their checks on this one machine's CPUs at
the same time, which real nodes do not: that figure is printed, not judged.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-cluster-token-0123456789"
TARGET = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp: Path, name: str, port: int, peers: list[int]) -> Path:
    kmsg = tmp / f"kmsg-{name}.log"
    kmsg.write_text("")
    path = tmp / f"{name}.toml"
    listed = ", ".join(f'"http://127.0.0.1:{p}"' for p in peers)
    path.write_text(
        f'node = "{name}"\n[paths]\nstate_dir = "{tmp / name}"\nkmsg_path = "{kmsg}"\n'
        f'[daemon]\nlisten = "127.0.0.1:{port}"\ntoken = "{TOKEN}"\npeers = [{listed}]\n'
        "check_run_min_interval_s = 0\n"
    )
    return path


def timed(args: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "dgxdoctor", *args], env=env, capture_output=True, timeout=300)
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ports = [free_port() for _ in range(3)]
        procs = []
        for i, port in enumerate(ports):
            cfg = write_config(tmp, f"peer-{i}", port, [])
            procs.append(subprocess.Popen([sys.executable, "-m", "dgxdoctor", "run", "--config", str(cfg)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        try:
            for port in ports:
                for _ in range(300):
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
            one = write_config(tmp, "local-1", free_port(), ports[:1])
            three = write_config(tmp, "local-3", free_port(), ports)
            single = statistics.median(timed(["check", "--config", str(one)], env) for _ in range(runs))
            failed = False
            print(f"check (this node alone): {single:.2f} s (median of {runs})")
            for label, cfg in (("1 peer", one), ("3 peers", three)):
                wall = statistics.median(timed(["check", "--cluster", "--config", str(cfg)], env) for _ in range(runs))
                ratio = wall / single
                if cfg is one:
                    ok = ratio <= TARGET
                    failed |= not ok
                    verdict = f"(target <= {TARGET}x) {'PASS' if ok else 'FAIL'}"
                else:
                    verdict = "(the four share this machine's CPUs: not judged)"
                print(f"check --cluster, {label}: {wall:.2f} s, {ratio:.2f}x check {verdict}")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(20)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""dgxdoctor run beside Prometheus's node_exporter, in one run: resident memory, CPU per minute at the default
schedule, and /metrics latency p50/p99 under concurrent scrapes. Prints the figures, the ratios and the targets
(at most 60 MiB resident, under 0.5% of a core, scrape p99 no worse than node_exporter's).

    /work/main/.venv/bin/python benchmarks/daemon_vs_node_exporter.py [--idle-s 60] [--scrapes 2000] [--threads 8]

node_exporter is the Debian binary ``prometheus-node-exporter`` (package prometheus-node-exporter). Both listen
on loopback only. The daemon runs the checks registered in this checkout at their default intervals.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Target:
    name: str
    argv: list[str]
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}")
            time.sleep(0.2)
        raise SystemExit(f"{self.name} did not serve {self.url} within 60 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def ps(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)


def cpu_seconds(proc: psutil.Process) -> float:
    """User+system CPU of the process and its children (checks may run commands)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def scrape_latencies(url: str, scrapes: int, threads: int) -> list[float]:
    per_thread = max(1, scrapes // threads)

    def worker(_: int) -> list[float]:
        out = []
        with httpx.Client(timeout=10) as client:
            for _ in range(per_thread):
                t0 = time.perf_counter()
                r = client.get(url)
                r.raise_for_status()
                _ = r.content
                out.append(time.perf_counter() - t0)
        return out

    with ThreadPoolExecutor(threads) as pool:
        return [x for chunk in pool.map(worker, range(threads)) for x in chunk]


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle-s", type=float, default=60.0, help="seconds of idle CPU measurement (default 60)")
    ap.add_argument("--scrapes", type=int, default=2000, help="scrapes per target (default 2000)")
    ap.add_argument("--threads", type=int, default=8, help="concurrent scrapers (default 8)")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="seconds to settle after start (default 10)")
    args = ap.parse_args()

    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        raise SystemExit("node_exporter not found: apt-get install prometheus-node-exporter")
    tmp = Path(tempfile.mkdtemp(prefix="dgxd-bench-"))
    config = tmp / "config.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp / "state"}"\n')
    ne_port, dd_port = free_port(), free_port()
    targets = [
        Target(
            "node_exporter",
            [node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
            f"http://127.0.0.1:{ne_port}/metrics",
            dict(os.environ),
        ),
        Target(
            "dgxdoctor",
            [sys.executable, "-m", "dgxdoctor", "run", "--config", str(config), "--listen", f"127.0.0.1:{dd_port}"],
            f"http://127.0.0.1:{dd_port}/metrics",
            {**os.environ, "PYTHONPATH": str(REPO / "src")},
        ),
    ]
    results: dict[str, dict[str, float]] = {}
    try:
        for t in targets:
            t.start()
        print(f"started both; settling {args.warmup_s:g} s, then {args.idle_s:g} s of idle CPU measurement")
        time.sleep(args.warmup_s)
        before = {t.name: cpu_seconds(t.ps()) for t in targets}
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        elapsed = time.monotonic() - t0
        for t in targets:
            used = cpu_seconds(t.ps()) - before[t.name]
            full = t.ps().memory_full_info()
            results[t.name] = {
                "rss_idle_mib": full.rss / MIB,
                # Unique set size: what the process alone holds (shared libraries not counted).
                "uss_idle_mib": full.uss / MIB,
                "cpu_s_per_min": used * 60 / elapsed,
                "cpu_pct_core": used / elapsed * 100,
            }
        for t in targets:
            lat = scrape_latencies(t.url, args.scrapes, args.threads)
            size = len(httpx.get(t.url, timeout=10).content)
            results[t.name].update(
                {
                    "p50_ms": pct(lat, 50) * 1000,
                    "p99_ms": pct(lat, 99) * 1000,
                    "rss_after_mib": t.ps().memory_info().rss / MIB,
                    "bytes": float(size),
                    "n": float(len(lat)),
                }
            )
    finally:
        for t in targets:
            t.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    ne, dd = results["node_exporter"], results["dgxdoctor"]
    rows = [
        ("resident memory, idle (MiB)", "rss_idle_mib", "{:.1f}"),
        ("resident memory, after scrapes (MiB)", "rss_after_mib", "{:.1f}"),
        ("unique memory (USS), idle (MiB)", "uss_idle_mib", "{:.1f}"),
        ("CPU per minute, idle (CPU-seconds)", "cpu_s_per_min", "{:.4f}"),
        ("CPU, idle (% of one core)", "cpu_pct_core", "{:.4f}"),
        ("/metrics p50 (ms)", "p50_ms", "{:.2f}"),
        ("/metrics p99 (ms)", "p99_ms", "{:.2f}"),
        ("/metrics size (bytes)", "bytes", "{:.0f}"),
    ]
    print(
        f"\n{args.threads} concurrent scrapers, {int(dd['n'])} scrapes per target; {os.cpu_count()} CPUs here; "
        "CPU figures have the kernel's 10 ms tick resolution"
    )
    print(f"{'':40} {'dgxdoctor':>12} {'node_exporter':>14} {'ratio':>8}")
    for label, key, fmt in rows:
        ratio = dd[key] / ne[key] if ne[key] else float("nan")
        print(f"{label:40} {fmt.format(dd[key]):>12} {fmt.format(ne[key]):>14} {ratio:>8.2f}")
    checks = [
        ("resident memory <= 60 MiB", max(dd["rss_idle_mib"], dd["rss_after_mib"]) <= 60),
        ("idle CPU < 0.5% of a core", dd["cpu_pct_core"] < 0.5),
        ("scrape p99 <= node_exporter's", dd["p99_ms"] <= ne["p99_ms"]),
    ]
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

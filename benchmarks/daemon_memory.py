#!/usr/bin/env python3
"""Where the idle daemon's memory goes, and whether it grows: `dgxdoctor run` with every default check beside
Prometheus's node_exporter.

    .venv/bin/python benchmarks/daemon_memory.py               # 10 minutes of scrapes
    .venv/bin/python benchmarks/daemon_memory.py --minutes 1   # a short run
    .venv/bin/python benchmarks/daemon_memory.py --python .venv/bin/python   # the test venv, src on PYTHONPATH

The daemon measured is dgxdoctor as the README installs it (benchmarks/installed.py: a cached ``python3 -m venv``
+ ``pip install .`` of this checkout, its ``dgxdoctor run``) unless ``--python PATH`` names another interpreter.

Prints, in order: tracemalloc's top 25 allocations by file (the daemon run in-process by
benchmarks/traced_daemon.py for --trace-s seconds; tracing costs memory itself, so that daemon's RSS is not the
one judged); then, for a plain `dgxdoctor run`, /proc/PID/smaps_rollup and the largest mappings of
/proc/PID/smaps grouped as anonymous, heap, stack and each file (.so); the idle RSS beside node_exporter's with the
ratio, and each one's private anonymous memory (pages no other process shares, so what else runs from the same
files does not move it); then --minutes of one /metrics and one /state scrape per second, RSS every 30 s and the
slope after --warmup-min (least squares, MiB per 10 minutes; none when --minutes <= --warmup-min). Targets: idle
RSS <= 64 MiB, growth <= 1 MiB per 10 minutes after warm-up. Exit 1 on a miss. node_exporter is the Debian
package prometheus-node-exporter.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
from installed import Product, add_argument, resolve

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
IDLE_TARGET_MIB = 64.0
GROWTH_TARGET_MIB = 1.0
# smaps header: "7f3c1a200000-7f3c1a400000 rw-p 00000000 00:00 0    [heap]"
MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(?P<path>.*)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}")
        time.sleep(0.2)
    raise SystemExit(f"{name} did not serve {url} within 90 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def smaps_rollup(pid: int) -> str:
    keep = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Shared_Clean", "Private_Clean", "Private_Dirty", "Anonymous")
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    return "\n".join(f"  {line}" for line in lines if line.split(":")[0] in keep)


def anonymous_mib(pid: int) -> float:
    """The process's own anonymous memory (smaps_rollup's Anonymous): no page shared with another process, so
    the figure does not move with what else runs from the same files."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def smaps_by_mapping(pid: int) -> dict[str, int]:
    """Resident KiB per mapping name: each file, or [anonymous], [heap], [stack] ..."""
    sizes: dict[str, int] = defaultdict(int)
    name = "[anonymous]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        header = MAPPING.match(line)
        if header:
            name = header["path"].strip() or "[anonymous]"
        elif line.startswith("Rss:"):
            sizes[name] += int(line.split()[1])
    return sizes


def print_mappings(pid: int, top: int = 20) -> None:
    sizes = smaps_by_mapping(pid)
    print(f"\nlargest mappings of /proc/{pid}/smaps (resident KiB)")
    for name, kib in sorted(sizes.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {kib:8d}  {name}")
    libs = sum(k for n, k in sizes.items() if ".so" in n)
    anon = sum(k for n, k in sizes.items() if n.startswith("["))
    print(f"  totals: anonymous/heap/stack {anon / 1024:.1f} MiB, shared objects {libs / 1024:.1f} MiB")


def traced(seconds: float, product: Product, config: Path) -> None:
    port = free_port()
    argv = [str(product.python), str(REPO / "benchmarks" / "traced_daemon.py"), str(seconds), "--", "run"]
    argv += ["--config", str(config), "--listen", f"127.0.0.1:{port}"]
    done = subprocess.run(argv, env=product.env(), capture_output=True, text=True, timeout=seconds + 120)
    print(f"\ntracemalloc, daemon in-process for {seconds:g} s, top 25 by file")
    for line in done.stdout.splitlines():
        if line.startswith("TRACEMALLOC "):
            print("  " + line.removeprefix("TRACEMALLOC "))


def slope_per_10min(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(t for t, _ in points) / n
    my = sum(r for _, r in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (r - my) for t, r in points) / var * 600 if var else float("nan")


def growth(pid: int, url: str, minutes: float, warmup_min: float) -> tuple[float, float]:
    """One /metrics and one /state scrape per second; returns (slope MiB/10 min after warm-up, last RSS)."""
    points: list[tuple[float, float]] = []
    t0 = time.monotonic()
    next_print = 0.0
    with httpx.Client(timeout=10) as client:
        while (elapsed := time.monotonic() - t0) < minutes * 60:
            client.get(f"{url}/metrics").raise_for_status()
            client.get(f"{url}/state")
            rss = rss_mib(pid)
            if elapsed >= warmup_min * 60:
                points.append((elapsed, rss))
            if elapsed >= next_print:
                print(f"  t={elapsed:6.0f} s  RSS {rss:6.2f} MiB", flush=True)
                next_print += 30
            time.sleep(max(0.0, 1 - (time.monotonic() - t0 - elapsed)))
    return slope_per_10min(points), rss_mib(pid)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="scrape once a second this long (default 10)")
    ap.add_argument("--warmup-min", type=float, default=1.0, help="minutes left out of the slope (default 1)")
    ap.add_argument("--idle-s", type=float, default=20.0, help="seconds after start before the idle figures")
    ap.add_argument("--trace-s", type=float, default=20.0, help="seconds of the tracemalloc run; 0 skips it")
    add_argument(ap)
    return ap.parse_args()


def main() -> int:
    args = parse()
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        raise SystemExit("node_exporter not found: apt-get install prometheus-node-exporter")
    tmp = Path(tempfile.mkdtemp(prefix="dgxd-mem-"))
    config = tmp / "config.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp / "state"}"\n')
    product = resolve(args.python)
    print(product.describe())
    if args.trace_s > 0:
        traced(args.trace_s, product, config)
    ne_port, dd_port = free_port(), free_port()
    ne = subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"], stderr=subprocess.DEVNULL)
    dd_argv = product.command("run", "--config", str(config), "--listen", f"127.0.0.1:{dd_port}")
    dd = subprocess.Popen(dd_argv, env=product.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{ne_port}/metrics", ne, "node_exporter")
        wait_ready(f"http://127.0.0.1:{dd_port}/metrics", dd, "dgxdoctor")
        time.sleep(args.idle_s)
        print(f"\n/proc/{dd.pid}/smaps_rollup (dgxdoctor, idle {args.idle_s:g} s)\n{smaps_rollup(dd.pid)}")
        print_mappings(dd.pid)
        idle, ne_idle = rss_mib(dd.pid), rss_mib(ne.pid)
        anon, ne_anon = anonymous_mib(dd.pid), anonymous_mib(ne.pid)
        print(
            f"\nresident, idle: dgxdoctor {idle:.1f} MiB, node_exporter {ne_idle:.1f} MiB, ratio {idle / ne_idle:.2f}"
        )
        print(f"\n{args.minutes:g} minutes, /metrics + /state once a second; slope after {args.warmup_min:g} min")
        slope, last = growth(dd.pid, f"http://127.0.0.1:{dd_port}", args.minutes, args.warmup_min)
        ne_last = rss_mib(ne.pid)
    finally:
        stop(dd)
        stop(ne)
        shutil.rmtree(tmp, ignore_errors=True)
    return verdict(idle, ne_idle, last, ne_last, slope, product, (anon, ne_anon))


def verdict(
    idle: float, ne_idle: float, last: float, ne_last: float, slope: float, product: Product,
    anon: tuple[float, float],
) -> int:  # fmt: skip
    ok_idle = idle <= IDLE_TARGET_MIB
    measured = slope == slope  # nan: no scrape after the warm-up (--minutes <= --warmup-min), no growth figure
    ok_growth = slope <= GROWTH_TARGET_MIB or not measured
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    how = "installed (README)" if product.installed else "src on PYTHONPATH"
    print(f"\n{stamp}, {os.cpu_count()} CPUs, Python {product.version()}, {product.python} ({how})")
    print(f"{'':34} {'dgxdoctor':>10} {'node_exporter':>14} {'ratio':>6}  {'target':<16} result")
    print(
        f"{'resident, idle (MiB)':34} {idle:10.1f} {ne_idle:14.1f} {idle / ne_idle:6.2f}  "
        f"{f'<= {IDLE_TARGET_MIB:g} MiB':<16} {'PASS' if ok_idle else 'FAIL'}"
    )
    print(f"{'resident, after scrapes (MiB)':34} {last:10.1f} {ne_last:14.1f} {last / ne_last:6.2f}")
    print(f"{'anonymous (private), idle (MiB)':34} {anon[0]:10.1f} {anon[1]:14.1f} {anon[0] / anon[1]:6.2f}")
    print(
        f"{'growth after warm-up (MiB/10 min)':34} {slope:10.2f} {'':14} {'':6}  "
        f"{f'<= {GROWTH_TARGET_MIB:g} MiB':<16} "
        + (("PASS" if ok_growth else "FAIL") if measured else "not measured (--minutes <= --warmup-min)")
    )
    return 0 if ok_idle and ok_growth else 1


if __name__ == "__main__":
    raise SystemExit(main())

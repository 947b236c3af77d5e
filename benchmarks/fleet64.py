"""64 agents on this machine, a real Prometheus scraping them: the cluster view through Prometheus against the mesh.

    PYTHONPATH=src .venv/bin/python benchmarks/fleet64.py [--nodes 64] [--group-size 4] [--window-s 60]

Starts ``--nodes`` real ``dgxdoctor run`` agents on loopback ports (tests/harness/fleet.py: each with its own config,
state directory, kernel log file and an empty sysfs; only the xid and peer_compare checks on), in serving groups of
``--group-size``, a real Prometheus (Debian's) scraping them every 2 s with `dgxdoctor rules` loaded, and a real
Alertmanager whose route groups by serving group. Then prints:

* the cluster view ``check --cluster --cached`` through Prometheus (``[fleet] prometheus_url``): the command's wall
  time, process start included (median of 3), target <= 2 s;
* a fresh ``check --cluster``: every node asked to run its checks now, 8 at a time, target <= 30 s;
* CPU and memory over ``--window-s``: every agent with Prometheus as the view (no peer fetches) plus Prometheus
  itself, against the mesh (every agent's peer_compare fetching every other agent's /state every 15 s, N x N; the
  same agents, reloaded with SIGHUP), target: the Prometheus-backed view costs less CPU than the mesh;
* the seconds from an XID 79 written into one node's kernel log to its group's alert firing in Prometheus, and to
  Alertmanager's notification for that group.

Exit 1 when a target is missed. Needs Debian's prometheus and prometheus-alertmanager; takes ~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402

from dgxdoctor.fleet.prom_view import fetch_view  # noqa: E402
from harness.fleet import FleetRig, wait, why_not_runnable  # noqa: E402

CACHED_TARGET_S = 2.0
FRESH_TARGET_S = 30.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children) from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def window(pids: dict[str, list[int]], seconds: float) -> dict[str, tuple[float, float]]:
    """Per set of processes: (CPU seconds used over ``seconds``, resident MiB at the end)."""
    before = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}
    time.sleep(seconds)
    return {k: (sum(cpu_s(p) for p in v) - before[k], sum(rss_mib(p) for p in v)) for k, v in pids.items()}


def timed_cli(rig: FleetRig, *args: str) -> tuple[float, dict[str, object], int]:
    t0 = time.monotonic()
    done = rig.cli(rig.agents[0], *args, "--json", timeout=120)
    seconds = time.monotonic() - t0
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"{args}: exit {done.returncode}\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}") from None
    return seconds, doc, done.returncode


def round_trip(prometheus_url: str) -> float:
    """The view's one query and its parsing, in this process (fleet.prom_view.fetch_view)."""

    async def once() -> float:
        async with httpx.AsyncClient() as client:
            view = await fetch_view(client, prometheus_url, "dgxdoctor", 10.0)
        return view.seconds

    return asyncio.run(once())


def process_floor() -> float:
    """A dgxdoctor process of this checkout that does nothing but start: what every command pays first."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "dgxdoctor", "--version"], env=env, capture_output=True, check=True)
    return time.monotonic() - t0


def reload_all(rig: FleetRig, prometheus: bool) -> None:
    for agent in rig.agents:
        agent.config.write_text(rig.agent_config(agent, prometheus))
        assert agent.proc is not None
        os.kill(agent.proc.pid, signal.SIGHUP)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=60.0)
    args = parser.parse_args()
    why = why_not_runnable()
    if why:
        print(f"skipped: {why}")
        return 0
    groups = {
        f"grp-{g:02d}": [f"n{g:02d}{i}" for i in range(args.group_size)] for g in range(args.nodes // args.group_size)
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="fleet64-") as tmp:
        rig = FleetRig(Path(tmp), groups, scrape_s=2.0, compare_s=15.0)
        try:
            rig.write_agents()
            rig.start_monitoring()
            t0 = time.monotonic()
            rig.start_agents()
            rig.wait_scraped(300)
            n = len(rig.agents)
            print(f"{n} agents in {len(groups)} serving groups of {args.group_size}, started and scraped in "
                  f"{time.monotonic() - t0:.0f} s; Prometheus scrapes every 2 s")  # fmt: skip

            cached = []
            for _ in range(3):
                seconds, doc, code = timed_cli(rig, "check", "--cluster", "--cached")
                nodes = doc["nodes"]
                assert isinstance(nodes, list) and len(nodes) == n, f"{len(nodes)} nodes in the view"
                cached.append(seconds)
            median = statistics.median(cached)
            failed |= median > CACHED_TARGET_S
            print(f"cluster view --cached through Prometheus: {median:.2f} s median of 3 "
                  f"({', '.join(f'{s:.2f}' for s in cached)}; {n} nodes, exit {code}), target <= "
                  f"{CACHED_TARGET_S:g} s: {verdict(median <= CACHED_TARGET_S)}")  # fmt: skip
            trip = statistics.median(round_trip(rig.prometheus_url) for _ in range(5))
            floor = statistics.median(process_floor() for _ in range(3))
            print(f"  of which the one PromQL round trip (in-process, median of 5): {trip * 1000:.0f} ms; "
                  f"a bare `dgxdoctor --version` process: {floor:.2f} s")  # fmt: skip

            seconds, doc, code = timed_cli(rig, "check", "--cluster", "--deadline", "60")
            nodes = doc["nodes"]
            assert isinstance(nodes, list)
            answered = sum(1 for x in nodes if isinstance(x, dict) and x.get("results") is not None)
            ok = seconds <= FRESH_TARGET_S and answered == n
            failed |= not ok
            print(f"fresh check --cluster, 8 nodes at a time: {seconds:.2f} s, {answered}/{n} nodes answered, "
                  f"target <= {FRESH_TARGET_S:g} s: {verdict(ok)}")  # fmt: skip

            agents = [a.proc.pid for a in rig.agents if a.proc is not None]
            prom = [p.pid for name, p in rig.procs if name == "prometheus"]
            time.sleep(5)
            with_prom = window({"agents": agents, "prometheus": prom}, args.window_s)
            reload_all(rig, prometheus=False)
            time.sleep(20)  # every agent's peer_compare runs with its 63 peers at least once before the window
            mesh = window({"agents": agents}, args.window_s)
            reload_all(rig, prometheus=True)
            prom_cpu = with_prom["agents"][0] + with_prom["prometheus"][0]
            mesh_cpu = mesh["agents"][0]
            share = 100 / args.window_s
            print(f"over {args.window_s:g} s, Prometheus as the view: agents {with_prom['agents'][0]:.1f} CPU-s "
                  f"({with_prom['agents'][0] * share:.0f}% of a core), {with_prom['agents'][1]:.0f} MiB RSS in all; "
                  f"Prometheus {with_prom['prometheus'][0]:.1f} CPU-s, {with_prom['prometheus'][1]:.0f} MiB; "
                  f"total {prom_cpu:.1f} CPU-s")  # fmt: skip
            print(f"over {args.window_s:g} s, the mesh ({n} x {n - 1} /state fetches every 15 s): agents "
                  f"{mesh_cpu:.1f} CPU-s ({mesh_cpu * share:.0f}% of a core), {mesh['agents'][1]:.0f} MiB RSS in all; "
                  f"Prometheus-backed / mesh CPU {prom_cpu / max(mesh_cpu, 1e-9):.2f}: "
                  f"{verdict(prom_cpu < mesh_cpu)}")  # fmt: skip
            failed |= prom_cpu >= mesh_cpu

            time.sleep(20)  # the reload back to Prometheus applied
            bad = rig.agents[len(rig.agents) // 2]
            written = rig.inject_critical(bad)
            alert = "DgxdoctorXidRebootRequired"
            fired = wait(lambda: any(a["labels"].get("node") == bad.name for a in rig.firing(alert)), 120, alert)
            firing_s = time.time() - written
            recorder = rig.recorder
            assert recorder is not None
            wait(lambda: any(b["groupLabels"] == {"group": bad.group} for b in recorder.bodies), 60,
                 "Alertmanager's notification")  # fmt: skip
            notified_s = time.time() - written
            print(
                f"XID 79 on {bad.name} ({bad.group}) to its group's alert firing in Prometheus: {firing_s:.1f} s "
                f"(polled {fired:.1f} s); to Alertmanager's notification for group {bad.group}: {notified_s:.1f} s"
            )
        finally:
            rig.stop()
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

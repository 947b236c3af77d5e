#!/usr/bin/env python3
"""CPU each check costs at the default schedule: thread CPU time of one run, times the runs per minute.

    PYTHONPATH=src .venv/bin/python benchmarks/check_cpu.py [--runs 5]

Builds every enabled check from the default config (state in a temporary directory), runs each once (first-run
work: imports, state files), then times ``--runs`` more runs with ``time.thread_time()`` (CPU of this thread
only, so the machine's other load does not count). Prints, per check, milliseconds per run and per minute at its
default interval, its status, and the total as a share of one core. The daemon's own overhead (event loop,
scheduler, one thread per run, /metrics) comes on top: benchmarks/daemon_vs_node_exporter.py measures the whole.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.config import load_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per check (default 5)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dgxd-checkcpu-"))
    config_path = tmp / "config.toml"
    config_path.write_text(f'[paths]\nstate_dir = "{tmp / "state"}"\n')
    config = load_config(config_path)
    env = config.environment(one_shot=False)
    total_s_per_min = 0.0
    print(f"{'check':14} {'interval':>9} {'ms/run':>8} {'ms/min':>8}  status")
    for factory in ALL_CHECKS:
        settings = config.check_settings(factory.name)
        if not settings.enabled:
            continue
        check = factory(settings, env)
        check.run()
        t0 = time.thread_time()
        for _ in range(args.runs):
            result = check.run()
        per_run = (time.thread_time() - t0) / args.runs
        per_min = per_run * 60 / settings.interval_s
        total_s_per_min += per_min
        print(
            f"{factory.name:14} {settings.interval_s:>8g}s {per_run * 1000:>8.2f} {per_min * 1000:>8.2f}  "
            f"{result.status.value}: {result.summary[:70]}"
        )
    print(f"total: {total_s_per_min * 1000:.1f} ms of CPU per minute = {total_s_per_min / 60 * 100:.3f}% of one core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

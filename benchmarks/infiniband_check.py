"""Cost of one `infiniband` check run over an 8-rail NDR sysfs tree, and the size of its state file.

Run: PYTHONPATH=src python benchmarks/infiniband_check.py [runs]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dgxdoctor.checks.infiniband import STATE_FILE_NAME, InfinibandCheck, InfinibandSettings
from dgxdoctor.environment import Environment

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/sysfs_ib/dgx_ndr_healthy.txt"


def build(root: Path) -> None:
    for line in FIXTURE.read_text().splitlines():
        if line and not line.startswith("#"):
            rel, _, value = line.partition(":")
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(value + "\n")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        build(base / "sys")
        now = [1_764_460_800.0]
        env = Environment(
            sysfs_root=base / "sys", proc_root=base / "proc", state_dir=base / "state", clock=lambda: now[0]
        )
        check = InfinibandCheck(InfinibandSettings(), env)
        counter = base / "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"
        times = []
        for _ in range(runs):
            now[0] += 30
            counter.write_text(f"{int(counter.read_text()) + 123_456_789}\n")
            t0 = time.perf_counter()
            result = check.run()
            times.append(time.perf_counter() - t0)
        times.sort()
        size = (base / "state" / STATE_FILE_NAME).stat().st_size
        print(f"runs: {runs} (30 s apart, {runs * 30 / 3600:.1f} h), ports: 8, samples/run: {len(result.samples)}")
        print(
            f"run time: median {times[len(times) // 2] * 1e3:.2f} ms, p95 {times[int(len(times) * 0.95)] * 1e3:.2f} ms"
        )
        print(f"state file: {size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How long the gpu check's own work takes on an 8-GPU node, NVML excluded: raw values -> snapshots -> verdict.

    PYTHONPATH=src python3 benchmarks/gpu_judge.py

(NVML itself, measured on the H200 test machine by scripts/gpu-capture.py: nvmlInit 16 ms, first read 25 ms
per GPU, then 7 ms per full sweep of 2 GPUs; see tests/fixtures/nvml/h200-2gpu-580.159.04.json "timing".)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dgxdoctor.checks.gpu import GpuSettings, judge
from dgxdoctor.sources.nvml import GpuSnapshot, NvmlSweep

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nvml" / "h100-hgx-8gpu-565.57.01.json"


def main() -> None:
    capture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    settings = GpuSettings()
    rounds = 2000
    t0 = time.perf_counter()
    for _ in range(rounds):
        gpus = tuple(GpuSnapshot.from_raw(i, raw) for i, raw in enumerate(capture["gpus"]))
        result = judge(NvmlSweep("565.57.01", 12070, gpus), settings)
    elapsed = time.perf_counter() - t0
    print(f"8 GPUs: {elapsed / rounds * 1e6:.0f} us per verdict ({len(result.samples)} samples, {rounds} rounds)")


if __name__ == "__main__":
    main()

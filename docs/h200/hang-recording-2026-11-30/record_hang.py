"""Record what NVML and /proc show while one rank of an NCCL all-reduce loop is frozen (SIGSTOP).

Two processes, one GPU each, all-reduce 64 MiB in a loop; after ~5 s rank 1 is stopped. Every 0.5 s for ~30 s
more, both GPUs are read through NVML (utilisation, SM clock, power, memory, and GPM SM activity where the GPU
has it) together with each rank's CPU use from /proc/<pid>/stat. Writes hang.csv and summary.txt to the folder
given as the first argument.

    python3 record_hang.py OUTDIR
"""

from __future__ import annotations

import csv
import os
import signal
import statistics
import sys
import time

import pynvml
import torch.multiprocessing as mp

PERIOD_S, BEFORE_S, AFTER_S = 0.5, 5.0, 30.0
TICK = os.sysconf("SC_CLK_TCK")


def loop(rank: int, port: int, ready: object) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.ones(16 << 20, device="cuda")
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    ready.set()  # type: ignore[attr-defined]
    while True:
        dist.all_reduce(buf)
        torch.cuda.synchronize()


def cpu_ticks(pid: int) -> int:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (proc(5) fields 14, 15)


def gpm(handle: object, previous: object) -> tuple[object, dict[str, float]]:
    """SM activity and occupancy from GPM (Hopper); empty where unsupported."""
    try:
        sample = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, sample)
        if previous is None:
            return sample, {}
        data = pynvml.c_nvmlGpmMetricsGet_t()
        data.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        data.numMetrics = 2
        data.sample1, data.sample2 = previous, sample
        data.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        data.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
        pynvml.nvmlGpmMetricsGet(data)
        pynvml.nvmlGpmSampleFree(previous)
        return sample, {"gpm_sm_util": data.metrics[0].value, "gpm_sm_occupancy": data.metrics[1].value}
    except pynvml.NVMLError as exc:
        return None, {"gpm_error": str(exc)}  # type: ignore[dict-item]


def main(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    ctx = mp.get_context("spawn")
    ready = [ctx.Event() for _ in range(2)]
    procs = [ctx.Process(target=loop, args=(r, 29577, ready[r])) for r in range(2)]
    for p in procs:
        p.start()
    for event in ready:  # CUDA and NCCL start-up; the loop runs after this
        if not event.wait(120):
            raise SystemExit("the all-reduce loop did not start within 120 s")
    rows, gpm_prev = [], [None, None]
    last = {p.pid: cpu_ticks(p.pid) for p in procs}
    t0, stopped = time.monotonic(), False
    while (now := time.monotonic() - t0) < BEFORE_S + AFTER_S:
        if not stopped and now >= BEFORE_S:
            os.kill(procs[1].pid, signal.SIGSTOP)
            stopped = True
        for gpu, (h, p) in enumerate(zip(handles, procs, strict=True)):
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            ticks = cpu_ticks(p.pid)
            gpm_prev[gpu], extra = gpm(h, gpm_prev[gpu])
            rows.append({
                "t_s": round(now, 2), "phase": "after_stop" if stopped else "before_stop", "gpu": gpu,
                "role": "stopped" if gpu == 1 else "waiting", "util_gpu_pct": util.gpu, "util_mem_pct": util.memory,
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                "mem_used_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used >> 20,
                "proc_cpu_pct": round(100 * (ticks - last[p.pid]) / TICK / PERIOD_S, 1), **extra,
            })
            last[p.pid] = ticks
        time.sleep(max(0.0, PERIOD_S - (time.monotonic() - t0 - now)))
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(os.path.join(outdir, "hang.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(outdir, "summary.txt"), "w") as f:
        for gpu in (0, 1):
            for phase in ("before_stop", "after_stop"):
                sel = [r for r in rows if r["gpu"] == gpu and r["phase"] == phase][1:]  # first: the delta's warm-up
                means = {k: round(statistics.mean(float(r[k]) for r in sel if k in r), 1) for k in keys
                         if k not in ("t_s", "phase", "gpu", "role", "gpm_error") and any(k in r for r in sel)}
                f.write(f"gpu {gpu} ({sel[0]['role']}) {phase}: {len(sel)} samples, means {means}\n")
    print(open(os.path.join(outdir, "summary.txt")).read())


if __name__ == "__main__":
    main(sys.argv[1])

"""A torch NCCL communicator running all-reduces in a loop (the serving Python's torch; run by scripts/h200-ras*.sh).

``job.py STATEDIR``: rank RANK of WORLD_SIZE (environment, default 0 of 1) on the first visible GPU, rendezvous at
MASTER_ADDR:MASTER_PORT. Writes ``STATEDIR/rank<R>.json`` (pid, versions) once the first all-reduce is done, then
``STATEDIR/rank<R>.progress`` (iterations, time) every second, until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main(statedir: Path) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29610")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world, device_id=device)
    x = torch.ones(4 << 20, device=device)  # 16 MiB of float32
    dist.all_reduce(x)
    torch.cuda.synchronize()
    info = {
        "rank": rank,
        "world_size": world,
        "pid": os.getpid(),
        "torch": torch.__version__,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "ready_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    statedir.mkdir(parents=True, exist_ok=True)
    (statedir / f"rank{rank}.json").write_text(json.dumps(info))
    done, last = 0, time.monotonic()
    while True:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        done += 1
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            (statedir / f"rank{rank}.progress").write_text(f"{done} {time.time():.3f}\n")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

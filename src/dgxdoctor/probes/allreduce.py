"""NCCL all-reduce bandwidth probe over torch.distributed, printing nccl-tests' table format.

Run it with the serving environment's Python (the one that has torch), not the agent's:

    /opt/vllm/bin/python -m dgxdoctor.probes.allreduce --gpus 8 --min-bytes 8M --max-bytes 1G

It exists for machines where nccl-tests is not built; where it is, point the ``nccl`` check at
``all_reduce_perf`` instead. Both print the same table, read by one parser. Bus bandwidth follows
nccl-tests' definition for all-reduce: busbw = algbw * 2 * (n - 1) / n. torch's all_reduce is in-place,
so the out-of-place and in-place column groups carry the same measurement.

Only stdlib at import time: torch is imported inside the worker processes.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from typing import Any

# Exit status for "this machine cannot run the probe" (no torch, fewer than 2 GPUs): not a fault.
EX_NOT_RUNNABLE = 3

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


# nccl-tests 2.13+ header, copied so the same parser reads both tools.
TABLE_HEADER = """\
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"""


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    number = text[: -1 if unit else None]
    if not (number.isascii() and number.isdigit()):  # "²".isdigit() is True, but int() refuses it
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 8M, 1G)")
    return int(number) * _UNITS[unit]


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, plan: list[int], iters: int, warmup: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for size in plan:
        count = size // 4
        buf = torch.ones(count, dtype=torch.float32, device="cuda")
        for _ in range(warmup):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / iters
        # A wrong sum is nccl-tests' "#wrong": every element must be world ** (warmup + iters).
        expected = float(world) ** (warmup + iters)
        wrong = int((buf != expected).sum().item()) if expected < 2**24 else 0
        rows.append((size, count, elapsed, wrong))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all visible)")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("8M"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)

    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        print(f"# torch is not importable by {sys.executable}: {exc}", file=sys.stderr)
        return EX_NOT_RUNNABLE

    world = args.gpus or torch.cuda.device_count()
    if world < 2:
        print(f"# need at least 2 GPUs, found {world}", file=sys.stderr)
        return EX_NOT_RUNNABLE
    # Small integers keep the sum check exact: each warm-up and iteration multiplies by world.
    iters = min(args.iters, 20)
    plan = sizes(args.min_bytes, args.max_bytes, args.factor)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    print(f"# nThread 1 nGpus {world} minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.factor}(factor)")
    print(f"# Using devices (torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))})")
    for rank in range(world):
        name = torch.cuda.get_device_properties(rank).name
        print(f"#  Rank {rank:2d} on {socket.gethostname()} device {rank} [{name}]")
    mp.spawn(_worker, args=(world, port, plan, iters, args.warmup, queue), nprocs=world, join=True)
    rows = queue.get()
    print(TABLE_HEADER)
    factor = 2 * (world - 1) / world
    busbws = []
    for size, count, elapsed, wrong in rows:
        algbw = size / elapsed / 1e9
        busbw = algbw * factor
        busbws.append(busbw)
        cells = f"{elapsed * 1e6:8.1f} {algbw:7.2f} {busbw:7.2f} {wrong:6d}"
        print(f"{size:12d}  {count:12d}     float     sum      -1  {cells}  {cells}")
    print(f"# Out of bounds values : {sum(r[3] for r in rows)} {'OK' if not any(r[3] for r in rows) else 'FAILED'}")
    print(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f} ")
    print("#")
    return 0


if __name__ == "__main__":
    sys.exit(main())

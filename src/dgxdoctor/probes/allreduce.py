"""NCCL all-reduce bandwidth probe over torch.distributed, printing nccl-tests' table format.

Run it with the serving environment's Python (the one that has torch), not the agent's:

    /opt/vllm/bin/python -m dgxdoctor.probes.allreduce --gpus 8 --min-bytes 8M --max-bytes 1G

Across nodes, every node runs it with the same ``--nnodes``, ``--master-addr`` (the first node's address) and
``--master-port``, and its own ``--node-rank``; ranks meet in one TCPStore rendezvous on the first node. A node that
does not join within ``--join-timeout`` seconds makes every rank give up with exit status ``EX_PEER_MISSING``,
never a hang. Each node's first rank prints the table of its own timing.

Timing follows nccl-tests (``src/common.cu``): ``iters`` back-to-back all-reduces after ``warmup`` ones, the time
per operation averaged over the ranks, busbw = algbw * 2 * (n - 1) / n. By default (``--timing direct``) the
operations are ``ncclAllReduce`` calls made through ctypes on the NCCL library torch loaded, between two CUDA
events, as nccl-tests makes them (20 per timing). torch's all_reduce adds c10d bookkeeping and stream events to
every call: on an H200 pair it reached 40-75 % of nccl-tests' busbw from 1 to 4 MiB launched one by one, 68-92 %
replayed from a CUDA graph (``--timing eager`` / ``--timing graph``, docs/h200/nccl-2026-11-30); those two paths run
more iterations at small sizes so one timing spans milliseconds. The median of ``--rounds`` timings is reported.
Without CUDA (the ``gloo`` backend, used by the tests on CPU) the loop runs eagerly under ``time.perf_counter``.
The all-reduce is in-place, so the out-of-place and in-place column groups carry the same measurement.

Only stdlib at import time: torch is imported inside the worker processes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import multiprocessing
import os
import queue as queue_mod
import socket
import statistics
import sys
import time
from typing import Any

from msgspec import Struct

# Exit status for "this machine cannot run the probe" (no torch, fewer than 2 ranks): not a fault.
EX_NOT_RUNNABLE = 3
# Exit status for "the other node(s) did not join the rendezvous in time".
EX_PEER_MISSING = 4

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# Quick mode: three sizes where busbw is already near its plateau, few iterations (answers in seconds).
# Eager torch calls: at these sizes within 2 % of the direct calls, and no second NCCL communicator to set up.
QUICK = {"min_bytes": 32 << 20, "max_bytes": 128 << 20, "iters": 5, "warmup": 2, "rounds": 1, "timing": "eager"}
# Below this size the iteration count grows (iters * SMALL_SIZE // size, at most MAX_ITERS) so one timing spans
# milliseconds, well over a launch or a graph upload (~10 us).
SMALL_SIZE = 8 << 20
MAX_ITERS = 200
PR_SET_PDEATHSIG = 1

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


def parse_assignment(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name.replace("_", "A").isalnum() or not name.isascii() or name[0].isdigit():
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    return name, value


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    if min_bytes < 1 or factor < 2:  # 0 * factor, or a factor of 1, would never reach max_bytes
        raise SystemExit(f"--min-bytes must be at least 1 and --factor at least 2, got {min_bytes} and {factor}")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def iters_for(size: int, iters: int) -> int:
    return min(MAX_ITERS, iters * max(1, SMALL_SIZE // max(size, 1))) if size < SMALL_SIZE else iters


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Plan(Struct, frozen=True):
    gpus: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    backend: str
    join_timeout_s: float
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    rounds: int
    timing: str

    @property
    def world(self) -> int:
        return self.gpus * self.nnodes


def _die_with_parent() -> None:
    """A worker must not outlive its probe (a killed probe must free the GPUs): SIGKILL on the parent's death."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass


def _worker(local_rank: int, plan: Plan, out: Any) -> None:
    _die_with_parent()
    import datetime

    import torch
    import torch.distributed as dist

    rank = plan.node_rank * plan.gpus + local_rank
    if local_rank == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if plan.backend == "nccl" else "n/a"
        out.put(("info", rank, {"torch": str(torch.__version__), "nccl": nccl}))
    timeout = datetime.timedelta(seconds=plan.join_timeout_s)
    try:
        store = dist.TCPStore(
            plan.master_addr, plan.master_port, plan.world, is_master=rank == 0, timeout=timeout, wait_for_workers=True
        )
    except Exception as exc:  # the rendezvous did not complete: a node is missing
        out.put(("join", rank, f"{type(exc).__name__}: {exc}"))
        return
    try:
        rows = _measure(torch, dist, store, rank, local_rank, plan, out)
    except Exception as exc:
        out.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        return
    if local_rank == 0:
        out.put(("rows", rank, rows))
    dist.destroy_process_group()


def _measure(torch: Any, dist: Any, store: Any, rank: int, local_rank: int, plan: Plan, out: Any) -> list[Any]:
    cuda = plan.backend == "nccl"
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=plan.world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(plan.backend, store=store, rank=rank, world_size=plan.world)
    direct = _direct_comm(torch, dist, store, rank, plan, device) if cuda and plan.timing == "direct" else None
    rows = []
    for i, size in enumerate(plan.sizes):
        count = size // 4
        wrong = _validate(torch, dist, count, rank, plan.world, device)
        # Direct calls: nccl-tests' own iteration count, so both carry the same fixed cost per timing; the torch
        # paths run more iterations at small sizes to spread their launch and graph-upload cost.
        iters = plan.iters if direct is not None else iters_for(size, plan.iters)
        buf = torch.zeros(count, dtype=torch.float32, device=device)
        if direct is not None:
            seconds, how = _direct_timer(torch, dist, direct, buf, iters, plan)
        else:
            timer = _graph_timer if cuda and plan.timing != "eager" else _eager_timer
            seconds, how = timer(torch, dist, buf, iters, plan)
        # nccl-tests averages the time over the ranks (common.cu: Allreduce(args, &deltaSec, average)).
        avg = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(avg)
        seconds = float(avg.item()) / plan.world
        rows.append((size, count, seconds, wrong, how))
        if local_rank == 0:
            busbw = size / seconds / 1e9 * 2 * (plan.world - 1) / plan.world
            print(f"# progress {i + 1}/{len(plan.sizes)} {size} B busbw {busbw:.2f} GB/s", file=sys.stderr, flush=True)
    if direct is not None:
        direct.destroy()
    return rows


class DirectNccl:
    """``ncclAllReduce`` called directly through ctypes on the NCCL library torch loaded, as nccl-tests calls it
    and as vLLM's own pynccl wrapper does for tensor-parallel all-reduce: no c10d work objects or stream events
    around each call, which cost a few microseconds per operation (an eighth of the time at 1 MiB on NVLink)."""

    FLOAT32, SUM = 7, 0  # ncclFloat32, ncclSum (nccl.h)

    def __init__(self, store: Any, rank: int, world: int) -> None:
        import ctypes

        self.ctypes = ctypes
        lib = ctypes.CDLL("libnccl.so.2")  # already loaded by torch: the same library, the same NCCL_* settings

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_byte * 128)]  # NCCL_UNIQUE_ID_BYTES

        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
        self.lib = lib
        uid = UniqueId()
        if rank == 0:
            self._check(lib.ncclGetUniqueId(ctypes.byref(uid)))
            store.set("dgxdoctor_nccl_id", ctypes.string_at(ctypes.addressof(uid), 128))
        else:
            raw = store.get("dgxdoctor_nccl_id")
            if len(raw) != 128:
                raise RuntimeError("rank 0 could not create an NCCL id")
            ctypes.memmove(ctypes.addressof(uid), raw, 128)
        self.comm = ctypes.c_void_p()
        self._check(lib.ncclCommInitRank(ctypes.byref(self.comm), world, uid, rank))

    def _check(self, result: int) -> None:
        if result != 0:
            raise RuntimeError(f"NCCL error {result}: {self.lib.ncclGetErrorString(result).decode()}")

    def all_reduce(self, ptr: int, count: int, stream: int) -> None:
        self._check(self.lib.ncclAllReduce(ptr, ptr, count, self.FLOAT32, self.SUM, self.comm, stream))

    def destroy(self) -> None:
        self.lib.ncclCommDestroy(self.comm)


def _direct_comm(torch: Any, dist: Any, store: Any, rank: int, plan: Plan, device: Any) -> DirectNccl | None:
    """The direct communicator, or None on every rank when any rank could not make one (CUDA-graph timing then)."""
    made: DirectNccl | None = None
    try:
        made = DirectNccl(store, rank, plan.world)
    except Exception as exc:
        if rank == 0:
            store.set("dgxdoctor_nccl_id", b"failed")
        print(f"# rank {rank}: direct NCCL calls unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
    ok = torch.tensor([1.0 if made is not None else 0.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() < 1.0:
        if made is not None:
            made.destroy()
        return None
    return made


def _direct_timer(torch: Any, dist: Any, nccl: DirectNccl, buf: Any, iters: int, plan: Plan) -> tuple[float, str]:
    stream = torch.cuda.current_stream().cuda_stream
    ptr, count = buf.data_ptr(), buf.numel()
    for _ in range(plan.warmup):
        nccl.all_reduce(ptr, count, stream)
    times = []
    for _ in range(plan.rounds):
        _align(torch, dist, buf.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            nccl.all_reduce(ptr, count, stream)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(times), "direct"


def _validate(torch: Any, dist: Any, count: int, rank: int, world: int, device: Any) -> int:
    """nccl-tests' #wrong: every rank contributes rank + 1, so every element must be world * (world + 1) / 2."""
    buf = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(buf)
    return int((buf != float(world * (world + 1) // 2)).sum().item())


def _align(torch: Any, dist: Any, device: Any) -> None:
    flag = torch.ones(1, device=device)
    dist.all_reduce(flag)
    if device.type == "cuda":
        torch.cuda.synchronize()


def _eager_timer(torch: Any, dist: Any, buf: Any, iters: int, plan: Plan) -> tuple[float, str]:
    cuda = buf.device.type == "cuda"
    for _ in range(plan.warmup):
        dist.all_reduce(buf)
    times = []
    for _ in range(plan.rounds):
        _align(torch, dist, buf.device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dist.all_reduce(buf)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times), "eager"


def _graph_timer(torch: Any, dist: Any, buf: Any, iters: int, plan: Plan) -> tuple[float, str]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(plan.warmup):
            dist.all_reduce(buf)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(iters):
                dist.all_reduce(buf)
    except Exception as exc:  # capture unsupported by this torch/NCCL: time the plain loop
        torch.cuda.synchronize()
        print(f"# cuda graph capture failed ({type(exc).__name__}: {exc}); eager timing", file=sys.stderr)
        return _eager_timer(torch, dist, buf, iters, plan)
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    times = []
    for _ in range(plan.rounds):
        _align(torch, dist, buf.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    del graph
    return statistics.median(times), "graph"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=0, help="ranks on this node (default: all visible GPUs)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes taking part (each runs this probe)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index; 0 hosts the rendezvous")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node 0, reachable from every node")
    p.add_argument("--master-port", type=int, default=0, help="rendezvous port on node 0 (0: a free one, 1 node)")
    p.add_argument("--join-timeout", type=float, default=60.0, help="seconds to wait for every node to join")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl", help="gloo: CPU, for tests")
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("8M"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("1G"))
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="timings per size; the median is reported")
    p.add_argument(
        "--timing",
        choices=("direct", "graph", "eager"),
        default="direct",
        help="nccl: direct ncclAllReduce calls (as nccl-tests), a CUDA graph of torch all_reduce, or the eager loop",
    )
    p.add_argument("--quick", action="store_true", help="32M-128M, 5 iterations, 1 round: an answer in seconds")
    p.add_argument("--env", type=parse_assignment, action="append", default=[], help="NAME=VALUE for NCCL")
    return p


def _plan(args: argparse.Namespace, gpus: int) -> Plan:
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    port = args.master_port or (_free_port() if args.nnodes == 1 else 0)
    if not port:
        raise SystemExit("--master-port is required with --nnodes > 1")
    return Plan(
        gpus=gpus,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=port,
        backend=args.backend,
        join_timeout_s=args.join_timeout,
        sizes=tuple(sizes(args.min_bytes, args.max_bytes, args.factor)),
        iters=args.iters,
        warmup=args.warmup,
        rounds=max(1, args.rounds),
        timing=args.timing,
    )


def _collect(procs: list[Any], out: Any, deadline: float) -> list[tuple[str, int, Any]]:
    messages: list[tuple[str, int, Any]] = []
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        with contextlib.suppress(queue_mod.Empty):
            messages.append(out.get(timeout=0.2))
        if any(m[0] in ("join", "error") for m in messages):
            break  # one rank failed: the others would wait for it until their own timeout
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join(5)
    while True:
        try:
            messages.append(out.get(timeout=0.05))
        except queue_mod.Empty:
            return messages


def _print_table(plan: Plan, rows: list[Any]) -> None:
    print(TABLE_HEADER)
    factor = 2 * (plan.world - 1) / plan.world
    busbws = []
    for size, count, elapsed, wrong, _how in rows:
        algbw = size / elapsed / 1e9
        busbw = algbw * factor
        busbws.append(busbw)
        cells = f"{elapsed * 1e6:8.1f} {algbw:7.2f} {busbw:7.2f} {wrong:6d}"
        print(f"{size:12d}  {count:12d}     float     sum      -1  {cells}  {cells}")
    bad = sum(r[3] for r in rows)
    print(f"# Out of bounds values : {bad} {'OK' if not bad else 'FAILED'}")
    print(f"# Avg bus bandwidth    : {sum(busbws) / max(len(busbws), 1):.4f} ")
    print("#")


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without CUDA: the driver's list, narrowed by CUDA_VISIBLE_DEVICES."""
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        present = 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return present
    return min(present, len([d for d in listed.split(",") if d.strip() and not d.strip().startswith("-")]))


def _header(plan: Plan, info: dict[str, str]) -> None:
    nccl = info.get("nccl", "n/a")
    print(
        f"# nThread 1 nGpus {plan.gpus} minBytes {plan.sizes[0] if plan.sizes else 0} "
        f"maxBytes {plan.sizes[-1] if plan.sizes else 0} step: 2(factor) warmup iters: {plan.warmup} "
        f"iters: {plan.iters} rounds: {plan.rounds} timing: {plan.timing if plan.backend == 'nccl' else 'eager'}"
    )
    print(f"# nNodes {plan.nnodes} nodeRank {plan.node_rank} nRanks {plan.world} backend {plan.backend}")
    print(f"# Using devices (torch {info.get('torch', '?')}, NCCL {nccl})")
    host = socket.gethostname()
    for local in range(plan.gpus):
        rank = plan.node_rank * plan.gpus + local
        # No device name: asking torch for it would create a CUDA context in this process, on the GPU under test.
        print(f"#  Rank {rank:2d} on {host} device {local} [{'cuda' if plan.backend == 'nccl' else 'cpu'}]", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name, value in args.env:
        os.environ[name] = value  # read by NCCL in the workers (spawned: they inherit this environment)
    # torch is imported by the workers only: importing it here too would cost seconds of a quick run.
    if importlib.util.find_spec("torch") is None:
        print(f"# torch is not importable by {sys.executable}", file=sys.stderr)
        return EX_NOT_RUNNABLE
    visible = visible_gpus() if args.backend == "nccl" else 1
    gpus = args.gpus or visible
    if args.backend == "nccl" and visible < gpus:
        print(f"# need {gpus} GPUs, found {visible}", file=sys.stderr)
        return EX_NOT_RUNNABLE
    plan = _plan(args, gpus)
    if plan.world < 2:
        print(f"# need at least 2 ranks, found {plan.world}", file=sys.stderr)
        return EX_NOT_RUNNABLE
    if plan.backend == "nccl":
        # CUDA must start fresh in each worker
        ctx: Any = multiprocessing.get_context("spawn")
    else:
        import torch  # noqa: F401  (forked workers share this import: seconds saved per rank without CUDA)

        ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, plan, out), daemon=True) for i in range(plan.gpus)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + plan.join_timeout_s + 60 + 30 * len(plan.sizes) * plan.rounds
    messages = _collect(procs, out, deadline)
    return _report(plan, messages, procs)


def _report(plan: Plan, messages: list[tuple[str, int, Any]], procs: list[Any]) -> int:
    for kind, rank, detail in messages:
        if kind == "join":
            print(f"# rank {rank}: not every node joined within {plan.join_timeout_s:g} s ({detail})", file=sys.stderr)
            return EX_PEER_MISSING
    for kind, rank, detail in messages:
        if kind == "error":
            print(f"# rank {rank} failed: {detail}", file=sys.stderr)
            return 1
    rows = next((detail for kind, _, detail in messages if kind == "rows"), None)
    _header(plan, next((detail for kind, _, detail in messages if kind == "info"), {}))
    if rows is None:
        codes = [p.exitcode for p in procs]
        print(f"# the ranks ended without a result (exit codes {codes})", file=sys.stderr)
        return 1
    print(f"# timing: {rows[0][4] if rows else 'none'}, median of {plan.rounds} round(s)")
    _print_table(plan, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

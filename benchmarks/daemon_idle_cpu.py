#!/usr/bin/env python3
"""Where the idle daemon's CPU goes: per thread, and per function of the event loop's thread, CPU-weighted.

    PYTHONPATH=src .venv/bin/python benchmarks/daemon_idle_cpu.py [--warmup-s 60] [--idle-s 60] [--top 25]

Runs `dgxdoctor run` in this process (a temporary state dir, the default checks at their default intervals, a
loopback port), waits ``--warmup-s`` (every check of interval up to 60 s has then run twice), then samples for
``--idle-s`` every 10 ms: each thread's CPU (``/proc/self/task/TID/schedstat``, nanoseconds) and, where it grew
since the last sample, its Python stack at that moment (``sys._current_frames``), so a function is charged the CPU
its thread used around it (a statistical profiler weighted by CPU, as py-spy's ``--idle`` off). Prints the
process's CPU over the window (``/proc/self/stat`` less the sampler's own thread) as a share of one core, the CPU
per thread name (threads born and gone between two samples, such as short check runs, are the remainder), and the
``--top`` functions of the event loop's thread by CPU charged to them as the innermost dgxdoctor frame and as the
innermost frame at all. The sampler is not part of the daemon; it costs a little CPU of its own (not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def thread_ns(tid: int) -> int | None:
    """Nanoseconds on CPU of thread ``tid`` of this process, None once it has gone.

    /proc/self/task/TID/schedstat: "12345678 2345 17" (run time in ns, wait time in ns, timeslices)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_s() -> float:
    """User + system CPU seconds of the whole process (exited threads included): /proc/self/stat fields 14, 15."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Sampler:
    """Each thread's CPU over the window, by thread name (check-vllm and check-gpu both count as check-*)."""

    def __init__(self, loop_ident: int) -> None:
        self.loop_ident = loop_ident
        self.by_thread: Counter[str] = Counter()
        self.last: dict[int, int] = {}
        self.me = threading.get_native_id()

    def sample(self, first: bool) -> None:
        for t in threading.enumerate():
            tid = t.native_id
            if tid is None or tid == self.me:
                continue
            ns = thread_ns(tid)
            if ns is None:
                continue
            grew = ns - self.last.get(tid, ns if first else 0)
            self.last[tid] = ns
            if grew > 0:
                self.by_thread[self.name(t)] += grew

    def name(self, t: threading.Thread) -> str:
        if t.ident == self.loop_ident:
            return "event loop"
        return t.name.split("-")[0] + "-*" if "-" in t.name else t.name


class LoopRecorder(asyncio.DefaultEventLoopPolicy):
    """Remembers the loop ``asyncio.run`` makes, so the sampler can run the profiler's switches on its thread."""

    loop: asyncio.AbstractEventLoop | None = None

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        LoopRecorder.loop = super().new_event_loop()
        return LoopRecorder.loop


def report(s: Sampler, used_s: float, elapsed: float) -> None:
    share = used_s / elapsed * 100
    print(f"\nprocess CPU over {elapsed:.0f} s (less the sampler): {used_s:.3f} s = {share:.3f} % of one core")
    counted = sum(s.by_thread.values()) / 1e9
    for name, ns in s.by_thread.most_common():
        print(f"  thread {name:30} {ns / 1e9:8.3f} s  {ns / 1e9 / elapsed * 100:6.3f} %")
    rest = used_s - counted
    print(f"  {'threads not seen alive (short runs)':37} {rest:8.3f} s  {rest / elapsed * 100:6.3f} %")
    sys.stdout.flush()


def measure(loop_ident: int, args: argparse.Namespace) -> None:
    time.sleep(args.warmup_s)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None and LoopRecorder.loop is not None:
        LoopRecorder.loop.call_soon_threadsafe(profiler.enable)
    me = threading.get_native_id()
    sampler = Sampler(loop_ident)
    sampler.sample(first=True)
    t0, p0, m0 = time.monotonic(), process_s(), thread_ns(me) or 0
    while time.monotonic() - t0 < args.idle_s:
        time.sleep(0.1)
        sampler.sample(first=False)
    elapsed = time.monotonic() - t0
    used = process_s() - p0 - ((thread_ns(me) or 0) - m0) / 1e9
    if profiler is not None and LoopRecorder.loop is not None:
        done = threading.Event()
        LoopRecorder.loop.call_soon_threadsafe(lambda: (profiler.disable(), done.set()))
        done.wait(5)
    report(sampler, used, elapsed)
    if profiler is not None:
        print("\nevent loop thread under cProfile (its overhead inflates the times; the counts are exact):")
        for key in ("tottime", "cumulative"):
            pstats.Stats(profiler, stream=sys.stdout).sort_stats(key).print_stats(args.top)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--top", type=int, default=25, help="functions printed with --profile")
    ap.add_argument("--profile", action="store_true", help="cProfile the event loop's thread over the window too")
    ap.add_argument("--config", help="a config file (default: a temporary state dir, every default check)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dgxd-idlecpu-"))
    config = Path(args.config) if args.config else tmp / "config.toml"
    if not args.config:
        config.write_text(f'[paths]\nstate_dir = "{tmp / "state"}"\n')
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    print(f"dgxdoctor run on 127.0.0.1:{port}: {args.warmup_s:g} s warm-up, {args.idle_s:g} s sampled", flush=True)
    asyncio.set_event_loop_policy(LoopRecorder())
    threading.Thread(target=measure, args=(threading.main_thread().ident, args), daemon=True, name="sampler").start()
    sys.argv = ["dgxdoctor", "run", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    from dgxdoctor.cli import main as dgxdoctor_main

    dgxdoctor_main()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Run `dgxdoctor run` in this process under tracemalloc for a while, then print where its Python memory is.

    PYTHONPATH=src .venv/bin/python benchmarks/traced_daemon.py SECONDS -- run --config C --listen 127.0.0.1:P

tracemalloc starts before anything of dgxdoctor is imported, so import-time allocations count. After SECONDS the
top 25 allocations by file and the total traced are printed to stdout, then the daemon is stopped with SIGTERM
(an orderly stop). Used by benchmarks/daemon_memory.py; tracing lives only here, never in the daemon itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import tracemalloc

TOP = 25


def report_and_stop() -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snapshot.statistics("filename")
    total = sum(s.size for s in stats)
    _current, peak = tracemalloc.get_traced_memory()
    print(f"TRACEMALLOC total {total / 2**20:.2f} MiB in {len(stats)} files (peak {peak / 2**20:.2f} MiB)")
    for s in stats[:TOP]:
        frame = s.traceback[0]
        print(f"TRACEMALLOC {s.size / 2**10:9.1f} KiB {s.count:7d} blocks  {frame.filename}")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    seconds = float(sys.argv[1])
    argv = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    tracemalloc.start(1)
    timer = threading.Timer(seconds, report_and_stop)
    timer.daemon = True
    timer.start()
    sys.argv = ["dgxdoctor", *argv]
    from dgxdoctor.cli import main as dgxdoctor_main

    dgxdoctor_main()


if __name__ == "__main__":
    main()

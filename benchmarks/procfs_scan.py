"""What a scan of the process table costs, per lookup the checks make, on the real /proc and on a busy copy.

    PYTHONPATH=src python benchmarks/procfs_scan.py [PROCESSES]

Times, over ``sources.procfs``: the bare listing; the host/nccl_env lookup (comm + cmdline of every process,
``matches("vllm")``); the vLLM check's lookup (cmdline of every process, stat of the matches); the ray check's
``processes_named`` (comm, netns of the matches); the drift check's ``find_serving_python``; and every field of
every process. The same lookups through psutil (what host and drift used before) are timed for comparison on the
real /proc. Then the same on a synthetic tree of PROCESSES (default 5000) processes in a temporary directory —
a busy DGX node runs a few thousand (Ray workers, vLLM's engine and worker processes, kernel threads). Prints
milliseconds per scan (best of 5) and microseconds per process.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from dgxdoctor.sources.procfs import iter_processes, processes_named
from dgxdoctor.sources.serving_env import find_serving_python
from dgxdoctor.sources.vllm_api import is_vllm_process

REPEATS = 5

# A busy node's mix: mostly idle Ray workers and Python helpers, some kernel threads, one vLLM server.
ARGVS: list[list[str]] = [
    ["ray::IDLE"],
    ["/opt/vllm/.venv/bin/python3", "-u", "/opt/vllm/.venv/lib/python3.12/site-packages/ray/dashboard/agent.py"],
    ["/usr/sbin/sshd", "-D"],
    [],  # a kernel thread
    ["/usr/lib/systemd/systemd-journald"],
    ["/bin/bash", "-l"],
]


def scans(root: Path) -> dict[str, Callable[[], object]]:
    def listing() -> object:
        return sum(1 for _ in iter_processes(root))

    def host_lookup() -> object:
        return [p.pid for p in iter_processes(root) if p.matches("vllm") and p.alive]

    def vllm_lookup() -> object:
        return [p.start_time for p in iter_processes(root) if is_vllm_process(p.cmdline) and p.stat is not None]

    def ray_lookup() -> object:
        return [p.pid for p in processes_named(root, ("raylet", "gcs_server")) if p.alive]

    def drift_lookup() -> object:
        return find_serving_python(root)

    def every_field() -> object:
        return [
            (p.comm, p.cmdline, p.exe, p.uid, p.state, p.cpu_ticks, p.start_time, p.netns) for p in iter_processes(root)
        ]

    return {
        "listing only": listing,
        "host/nccl_env: comm+cmdline match": host_lookup,
        "vllm: cmdline, stat of matches": vllm_lookup,
        "ray: comm, netns of matches": ray_lookup,
        "drift: serving python": drift_lookup,
        "every field of every process": every_field,
    }


def psutil_scans() -> dict[str, Callable[[], object]]:
    def host_before() -> object:
        return [p.info["pid"] for p in psutil.process_iter(["pid", "name", "cmdline"])]

    def drift_before() -> object:
        return [p.info["exe"] for p in psutil.process_iter(["exe", "cmdline", "uids"])]

    return {
        "psutil: pid, name, cmdline (host before)": host_before,
        "psutil: exe, cmdline, uids (drift before)": drift_before,
    }


def best_ms(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def report(title: str, root: Path, count: int, extra: dict[str, Callable[[], object]] | None = None) -> None:
    print(f"{title}: {count} processes")
    for name, fn in {**scans(root), **(extra or {})}.items():
        ms = best_ms(fn)
        print(f"  {name:<44} {ms:8.2f} ms  {1000 * ms / max(count, 1):7.1f} us/process")


def lay_out(root: Path, count: int) -> None:
    root.mkdir(parents=True)
    (root / "stat").write_text("cpu  1 2 3 4\nbtime 1796003545\n")
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "net").symlink_to("net:[4026531840]")
    uid = os.geteuid()
    for pid in range(1, count + 1):
        argv = ARGVS[pid % len(ARGVS)]
        if pid == count // 2:
            argv = ["/opt/vllm/.venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]
        comm = (argv[0].rsplit("/", 1)[-1] if argv else f"kworker/{pid % 64}:1")[:15]
        d = root / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (d / "stat").write_text(
            f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194304 100 0 0 0 644 105 0 0 20 0 1 0 177676 3133440 390 "
            + "0 " * 28
            + "\n"
        )
        (d / "status").write_text(f"Name:\t{comm}\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "ns" / "net").symlink_to("net:[4026531840]")
        if argv:
            (d / "exe").symlink_to(argv[0])


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    real = sum(1 for name in os.listdir("/proc") if name.isdigit())
    report("real /proc", Path("/proc"), real, psutil_scans())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        lay_out(root, count)
        report(f"synthetic tree under {tmp}", root, count)


if __name__ == "__main__":
    main()

"""`dgxdoctor diagnose` over a big log beside `grep -c` on the same file: MB/s and peak resident memory.

    PYTHONPATH=src python benchmarks/diagnose_scan.py [--sizes 50,1000] [--stdin] [--runs 3] [--every 10000]
    PYTHONPATH=src python benchmarks/diagnose_scan.py --sizes '' --kinds [--kind-mb 20] [--runs 3]

For each size (MB) a vLLM/Ray/NCCL log of ordinary lines with one real failure line every 10,000 lines (``--every``:
a failing service that logs its error every few lines makes every line it hits cost a record's reading) is written
to a temporary directory (deleted after), then read by `python -m dgxdoctor diagnose FILE --json` (and, with
``--stdin``, from a pipe) and by `grep -c 'NCCL WARN'`. Targets (the doctor and scanning issues): at least
50 MB/s scanned (the seconds of `diagnose` on a one-line file, Python's start-up and imports, left out; the
end-to-end rate is printed beside it), at most 150 MB peak RSS whatever the size, and every failure line
named. Prints PASS/FAIL per figure and exits 1 on a miss.

With ``--kinds``, also ``--kind-mb`` MB of each kind of real log the corpus holds (``real_logs.py``: vLLM start-up
with KV-cache profiling, PyTorch's ProcessGroupNCCL banners, NCCL INIT lines, start-up warnings, serving access
logs, Ray logs, kernel logs), each its own file: the rate of each kind, the worst kind, `grep -c` on the same file as
the peer, the child's peak RSS, and PASS/FAIL on the worst kind (at least 50 MB/s by CPU time, at most 150 MB
resident): the cost of a log must not depend on what healthy text it holds. Beside each, the rate of the
uncatalogued-error pass (``judge.uncatalogued``) over every line of the kind, in this process (``diagnose`` runs it
on the head, the logs check on every line it reads), with the same target.

On a machine shared with other work the wall time of one run moves by a factor of two: each figure is the best
of ``--runs`` runs, each run of the big file right after one of the one-line file (the two see the same load),
and the same rate from the child's CPU time (user + sys from wait4), which load barely moves, is printed beside
the wall-clock one: a wall rate far under the CPU rate means the machine was busy, not that the scan got slower.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from real_logs import KINDS, write_kind

ORDINARY = [
    "INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds",
    "(APIServer pid=7) INFO 12-18 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 812.3 tokens/s, "
    "Avg generation throughput: 1204.9 tokens/s, Running: 64 reqs, Waiting: 0 reqs, GPU KV cache usage: 41.2%",
    "2024-07-25 06:50:45,885\tINFO worker.py:1788 -- Connected to Ray cluster.",
    "gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB; OOB eno1np0:172.18.62.6<0>",
    '(APIServer pid=7) INFO:     127.0.0.1:52144 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "(RayWorkerWrapper pid=5157, ip=10.0.0.2) INFO 12-18 10:00:00 [custom_all_reduce.py:224] Registering 4515 "
    "cuda graph addresses",
]
# Real: vllm-project/vllm#5094 (tests/fixtures/logs/gloo_socket.log)
FAILURE = "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"
MIN_MB_S = 50.0
MAX_RSS_MB = 150.0
CHUNK = 8 << 20


def write_log(path: Path, megabytes: float, every: int = 10_000) -> int:
    """The synthetic log, written in chunks (the generator holds no more than one); the failure lines in it."""
    target, size, failures, i = megabytes * 1e6, 0, 0, 0
    with path.open("w", encoding="utf-8") as fh:
        while size < target:
            lines = []
            for _ in range(20_000):
                failure = i % every == every - 1
                lines.append(FAILURE if failure else ORDINARY[i % len(ORDINARY)])
                failures += failure
                i += 1
            chunk = "\n".join(lines) + "\n"
            fh.write(chunk)
            size += len(chunk)
    return failures


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float  # the child's user + sys
    rss_mb: float  # the child's peak resident memory
    report: dict[str, object]


def run_diagnose(path: Path, via_stdin: bool) -> Run:
    """One `dgxdoctor diagnose PATH --json` (from a pipe with ``via_stdin``) in a child process."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    args = [sys.executable, "-m", "dgxdoctor", "diagnose", "-" if via_stdin else str(path), "--json"]
    t0 = time.perf_counter()
    with path.open("rb") as stdin:
        proc = subprocess.Popen(args, stdin=stdin if via_stdin else None, stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        out = proc.stdout.read()
        # wait4, not wait: the child's own peak RSS (ru_maxrss of RUSAGE_CHILDREN is the largest of all children).
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
    seconds = time.perf_counter() - t0
    return Run(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, json.loads(out))


def run_grep(path: Path, word: str = "NCCL WARN") -> float:
    t0 = time.perf_counter()
    subprocess.run(["grep", "-c", word, str(path)], stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def findings(report: dict[str, object]) -> list[str]:
    """The codes of every finding of a `diagnose --json` report."""
    inputs = report["inputs"]
    assert isinstance(inputs, list)
    return [f["code"] for i in inputs if isinstance(i, dict) for f in i.get("findings", []) if isinstance(f, dict)]


@dataclass(frozen=True)
class KindRate:
    kind: str
    size_mb: float
    wall_rate: float  # MB/s after start-up, wall clock
    cpu_rate: float  # MB/s after start-up, the child's CPU time
    grep_s: float
    wall_s: float
    rss_mb: float
    codes: list[str]
    uncatalogued_rate: float  # MB/s of judge.uncatalogued over every line, in this process


# Run in a child of its own: a child forked from a parent holding a big log inherits its peak RSS (ru_maxrss
# survives exec), which would be counted to every `diagnose` run after it.
_UNCATALOGUED = """
import sys, time
from dgxdoctor.diagnose.logs import _Known
from dgxdoctor.judge.signatures import load_catalog
from dgxdoctor.judge.uncatalogued import uncatalogued

known = _Known(load_catalog().by_code())
uncatalogued(["ERROR:root:warm-up"], set(), known)
with open(sys.argv[1], encoding="utf-8") as fh:
    lines = fh.read().splitlines()
t0 = time.process_time()
uncatalogued(lines, set(), known)
print(time.process_time() - t0)
"""


def uncatalogued_rate(path: Path) -> float:
    """MB/s of the uncatalogued-error pass over every line of ``path`` (``diagnose`` runs it on the head; the logs
    check on every line it reads): CPU seconds of the pass alone, in a child, the catalog loaded before."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _UNCATALOGUED, str(path)], env=env, capture_output=True, text=True, check=True
    )
    return path.stat().st_size / 1e6 / max(float(out.stdout.split()[-1]), 1e-3)


def bench_kind(path: Path, kind: str, n: int, one_line: Path) -> KindRate:
    """One kind of real log: the best of ``n`` runs of `diagnose`, each after one of the one-line file."""
    size_mb = path.stat().st_size / 1e6
    grep_s = min(run_grep(path) for _ in range(n))
    start, full = runs(path, one_line, False, n)
    wall, cpu = min(r.wall_s for r in full), min(r.cpu_s for r in full)
    start_wall, start_cpu = min(r.wall_s for r in start), min(r.cpu_s for r in start)
    return KindRate(
        kind,
        size_mb,
        size_mb / max(wall - start_wall, 1e-3),
        size_mb / max(cpu - start_cpu, 1e-3),
        grep_s,
        wall,
        max(r.rss_mb for r in full),
        sorted(set(findings(full[0].report))),
        uncatalogued_rate(path),
    )


def bench_kinds(tmp: Path, megabytes: float, n: int, one_line: Path) -> bool:
    """Every kind of real log, then the worst kind against the targets."""
    print(f"each kind of real log, {megabytes:g} MB (best of {n}; MB/s after start-up, by CPU time and wall clock):")
    head = ("kind", "CPU MB/s", "wall MB/s", "diagnose s", "grep -c s", "x grep", "RSS MB", "uncat MB/s")
    print("  {:26} {:>9} {:>9} {:>10} {:>9} {:>6} {:>6} {:>10}  findings".format(*head))
    rates = []
    for kind in KINDS:
        path = tmp / f"{kind}.log"
        write_kind(path, kind, megabytes)
        r = bench_kind(path, kind, n, one_line)
        path.unlink()
        rates.append(r)
        print(
            f"  {r.kind:26} {r.cpu_rate:9.1f} {r.wall_rate:9.1f} {r.wall_s:10.2f} {r.grep_s:9.3f} "
            f"{r.wall_s / max(r.grep_s, 1e-3):6.0f} {r.rss_mb:6.0f} {r.uncatalogued_rate:10.1f}  "
            f"{', '.join(r.codes) or '-'}",
            flush=True,
        )
    worst = min(rates, key=lambda r: r.cpu_rate)
    unc = min(rates, key=lambda r: r.uncatalogued_rate)
    rss = max(r.rss_mb for r in rates)
    checks = [
        (
            f"worst kind {worst.kind}: {worst.cpu_rate:.1f} MB/s by CPU time ({worst.wall_rate:.1f} by wall clock) "
            f"(target >= {MIN_MB_S:g})",
            worst.cpu_rate >= MIN_MB_S,
        ),
        (f"peak RSS {rss:.0f} MB over every kind (target <= {MAX_RSS_MB:g})", rss <= MAX_RSS_MB),
        (
            f"uncatalogued-error pass over every line, worst kind {unc.kind}: {unc.uncatalogued_rate:.1f} MB/s "
            f"(target >= {MIN_MB_S:g})",
            unc.uncatalogued_rate >= MIN_MB_S,
        ),
    ]
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'} {text}")
    return all(ok for _, ok in checks)


def named(report: dict[str, object]) -> int:
    inputs = report["inputs"]
    assert isinstance(inputs, list)
    counts = [i["data"].get("matches", {}).get("GLOO_SOCKET", 0) for i in inputs if isinstance(i, dict)]
    return max(counts, default=0)


def runs(path: Path, one_line: Path, via_stdin: bool, n: int) -> tuple[list[Run], list[Run]]:
    """``n`` runs of the one-line file (Python's start-up and the imports, which every size pays once; the
    start-up figure is the start-up benchmark's) each followed by one of ``path``."""
    start, full = [], []
    for _ in range(n):
        start.append(run_diagnose(one_line, via_stdin=False))
        full.append(run_diagnose(path, via_stdin))
    return start, full


def bench(path: Path, failures: int, via_stdin: bool, n: int, one_line: Path) -> bool:
    size_mb = path.stat().st_size / 1e6
    grep_s = min(run_grep(path) for _ in range(n))
    start, full = runs(path, one_line, via_stdin, n)
    wall, cpu = min(r.wall_s for r in full), min(r.cpu_s for r in full)
    start_wall, start_cpu = min(r.wall_s for r in start), min(r.cpu_s for r in start)
    rate = size_mb / max(wall - start_wall, 1e-3)
    cpu_rate = size_mb / max(cpu - start_cpu, 1e-3)
    rss = max(r.rss_mb for r in full)
    found = min(named(r.report) for r in full)
    checks = [
        (
            f"throughput {rate:.1f} MB/s after {start_wall:.2f} s of start-up (target >= {MIN_MB_S:g}; "
            f"{size_mb / wall:.1f} MB/s end to end; by CPU time {cpu_rate:.1f} MB/s after {start_cpu:.2f} s, "
            f"{size_mb / max(cpu, 1e-3):.1f} MB/s end to end)",
            rate >= MIN_MB_S,
        ),
        (f"peak RSS {rss:.0f} MB (target <= {MAX_RSS_MB:g})", rss <= MAX_RSS_MB),
        (f"failure lines named {found} of {failures}", found == failures),
    ]
    source = "stdin" if via_stdin else "file"
    print(
        f"{size_mb:,.0f} MB from {source}: diagnose {wall:.2f} s ({cpu:.2f} s CPU), grep -c {grep_s:.2f} s "
        f"({wall / grep_s:.0f}x grep; grep {size_mb / grep_s:,.0f} MB/s); best of {n}"
    )
    print(
        "  runs (wall/CPU s): start-up "
        + ", ".join(f"{r.wall_s:.2f}/{r.cpu_s:.2f}" for r in start)
        + "; diagnose "
        + ", ".join(f"{r.wall_s:.2f}/{r.cpu_s:.2f}" for r in full)
    )
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'} {text}")
    return all(ok for _, ok in checks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,1000", help="log sizes in MB, comma-separated")
    parser.add_argument("--stdin", action="store_true", help="also read each log from a pipe")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure, the best kept (default 3)")
    parser.add_argument("--every", type=int, default=10_000, help="lines per failure line (default 10000)")
    parser.add_argument("--kinds", action="store_true", help="also each kind of real log (real_logs.py)")
    parser.add_argument("--kind-mb", type=float, default=20.0, help="MB of each kind of real log (default 20)")
    args = parser.parse_args()
    ok = True
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        one_line = tmp / "one.log"
        one_line.write_text(ORDINARY[0] + "\n")
        for size in (float(s) for s in args.sizes.split(",") if s.strip()):
            path = tmp / "vllm.log"
            failures = write_log(path, size, max(1, args.every))
            for via_stdin in (False, True) if args.stdin else (False,):
                ok &= bench(path, failures, via_stdin, max(1, args.runs), one_line)
            path.unlink()
        if args.kinds:
            ok &= bench_kinds(tmp, args.kind_mb, max(1, args.runs), one_line)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

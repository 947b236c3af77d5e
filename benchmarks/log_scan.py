"""How fast the logs check reads and matches a busy log.

    PYTHONPATH=src python benchmarks/log_scan.py [MEGABYTES]

Writes a synthetic vLLM/Ray log of ordinary INFO lines with one real failure line every 10,000 lines, then times
(1) the catalog's match over every line, (2) a LogFollower poll + that match over the whole file, and (3) what the
logs check itself does (checks/logs.py): a LogFollower poll, then the new lines fed to a ``judge.scan.Scanner``
(the block prefilter over them at once, only its hits read line by line), and prints lines per second and MB per
second for each.

Then (4) the logs check's path over a log of the same size made only of NCCL's ordinary warnings (``NCCL WARN``
lines that are no failure), against (3): at most ``NCCL_WARN_MAX_RATIO`` times the seconds of the plain log,
PASS/FAIL, exit 1 on a miss (issue 34: such lines cost 12 times plain text while the catalog anchored a pattern
on ``NCCL WARN``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dgxdoctor.judge.scan import Scanner
from dgxdoctor.judge.signatures import Catalog, load_catalog
from dgxdoctor.sources.logtail import LogFollower

ORDINARY = [
    "INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds",
    "INFO 07-25 06:50:45 config.py:718] Defaulting to use ray for distributed inference",
    "2024-07-25 06:50:45,885\tINFO worker.py:1788 -- Connected to Ray cluster.",
    "gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB; OOB eno1np0:172.18.62.6<0>",
    'INFO:     127.0.0.1:52144 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]
# NCCL's own warnings that name no failure (its format: host:pid:tid [dev] file:line NCCL WARN ...)
NCCL_WARN = [
    "gcn6:1080060:1080075 [3] transport/net_ib.cc:1302 NCCL WARN NET/IB : mlx5_0:1 port is slow to come up, retrying",
    "gcn6:1080060:1080075 [3] enqueue.cc:1602 NCCL WARN Cuda graph capture: operation not permitted, falling back",
    "gcn6:1080060:1080061 [0] misc/param.cc:47 NCCL WARN Invalid value 16 for NCCL_MIN_NCHANNELS, using default 2",
    "dgx-a:4242:4300 [7] NCCL WARN [Service thread] Accept failed Resource temporarily unavailable",
]
NCCL_WARN_MAX_RATIO = 2.0
FAILURE = "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"


def scan_seconds(log: Path, size: int, catalog: Catalog) -> tuple[float, int]:
    """The logs check's path over ``log``: a LogFollower poll, then its lines fed to a Scanner; (seconds, matches)."""
    follower = LogFollower(from_start=True)
    t0 = time.perf_counter()
    polled = follower.poll([str(log)], size + 1)
    scanner = Scanner(catalog, "vllm", trusted_only=True)  # as checks/logs.py feeds each file's new lines
    scanned = [*scanner.feed("\n".join(line for _, line in polled.lines)), *scanner.flush()]
    return time.perf_counter() - t0, len(scanned)


def nccl_warn_against_plain(tmp: Path, megabytes: float, catalog: Catalog) -> tuple[str, bool]:
    """(4): NCCL's ordinary warnings against the plain log of the same size, the best of three runs each."""
    logs = {}
    for name, source in (("plain", ORDINARY), ("nccl warn", NCCL_WARN)):
        lines, size = [], 0
        while size < megabytes * 1e6:
            lines.append(source[len(lines) % len(source)])
            size += len(lines[-1]) + 1
        logs[name] = (tmp / f"{name.replace(' ', '_')}.log", size)
        logs[name][0].write_text("\n".join(lines) + "\n")
    best = {name: min(scan_seconds(log, size, catalog)[0] for _ in range(3)) for name, (log, size) in logs.items()}
    ratio = best["nccl warn"] / best["plain"]
    verdict = "PASS" if ratio <= NCCL_WARN_MAX_RATIO else "FAIL"
    size_mb = logs["plain"][1] / 1e6
    text = (f"NCCL WARN lines: {best['nccl warn']:.2f} s against plain text {best['plain']:.2f} s "
            f"({size_mb:.1f} MB each): {ratio:.2f}x, target <= {NCCL_WARN_MAX_RATIO:g}x {verdict}")  # fmt: skip
    return text, verdict == "PASS"


def main() -> None:
    megabytes = float(sys.argv[1]) if len(sys.argv) > 1 else 64.0
    catalog = load_catalog()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "vllm.log"
        lines = []
        size = 0
        i = 0
        while size < megabytes * 1e6:
            line = FAILURE if i % 10_000 == 9_999 else ORDINARY[i % len(ORDINARY)]
            lines.append(line)
            size += len(line) + 1
            i += 1
        log.write_text("\n".join(lines) + "\n")

        t0 = time.perf_counter()
        matches = sum(len(catalog.match(line, "vllm")) for line in lines)
        match_s = time.perf_counter() - t0

        follower = LogFollower(from_start=True)
        t0 = time.perf_counter()
        polled = follower.poll([str(log)], int(size) + 1)
        followed = sum(len(catalog.match(line, "vllm")) for _, line in polled.lines)
        poll_s = time.perf_counter() - t0

        check_s, scanned = scan_seconds(log, int(size), catalog)
        nccl_warn, passed = nccl_warn_against_plain(Path(tmp), megabytes, catalog)

    print(f"log: {size / 1e6:.1f} MB, {len(lines)} lines, {matches} failure lines")
    print(f"match only:    {match_s:.2f} s, {len(lines) / match_s:,.0f} lines/s, {size / 1e6 / match_s:.1f} MB/s")
    print(f"poll + match:  {poll_s:.2f} s, {len(lines) / poll_s:,.0f} lines/s, {size / 1e6 / poll_s:.1f} MB/s")
    print(f"poll + scan:   {check_s:.2f} s, {len(lines) / check_s:,.0f} lines/s, {size / 1e6 / check_s:.1f} MB/s")
    print(nccl_warn)
    assert followed == matches == scanned
    if not passed:
        sys.exit(1)


if __name__ == "__main__":
    main()

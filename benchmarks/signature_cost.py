"""A long adversarial line costs linear time in the signature catalog: a budget per KiB, not a wall-clock total.

    PYTHONPATH=src .venv/bin/python benchmarks/signature_cost.py

The lines are built from the catalog itself: every pattern's anchor (the literal text the prefilter looks for)
repeated to fill the line, and NCCL's own record head repeated (a 16 KiB ``NCCL WARN`` line took 147 ms when
``NCCL WARN .*[Nn]o device found`` was retried from every ``NCCL WARN``). Each line is read as ``diagnose`` and
the logs check read it (judge.scan.Scanner, with the context rules). The budget is relative: the cost per KiB of
a 16 KiB line may be at most four times that of a 2 KiB line of the same text (quadratic cost is eight times), and
never more than an absolute ceiling far above linear and far below the old quadratic figure.

Wall-clock figures, so they live here and not in the unit suite (``tests/unit/test_signature_cost.py`` holds the
structure without a clock: no piece the catalog searches holds an unbounded ``.*`` or ``.+``). Prints each seed's
cost per KiB with PASS/FAIL; exits 1 on a miss. ``scripts/test-all`` runs it.
"""

from __future__ import annotations

import sys
import time

from dgxdoctor.judge.scan import Scanner
from dgxdoctor.judge.signatures import anchor, load_catalog

CEILING_MS_PER_KIB = 6.0
GROWTH = 4.0
SLACK_MS_PER_KIB = 0.1


def seeds() -> list[str]:
    found = {"NCCL WARN ", "gpu5:35917:35994 [0] NCCL WARN ", "NCCL WARN NET/IB : "}
    for sig in load_catalog().signatures:
        found.update(anchor(p.pattern) + " " for p in sig.patterns)
    return sorted(found)


def cost_ms_per_kib(seed: str, kib: int) -> float:
    line = (seed * (kib * 1024 // len(seed) + 1))[: kib * 1024]
    catalog = load_catalog()
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        scanner = Scanner(catalog)
        scanner.feed(line)
        scanner.flush()
        catalog.match(line)
        best = min(best, time.thread_time() - t0)
    return best * 1000 / kib


def verdict(seed: str) -> tuple[bool, str]:
    """(within budget, the figures): a 16 KiB line cheap enough passes without the 2 KiB comparison."""
    long = cost_ms_per_kib(seed, 16)
    if long <= SLACK_MS_PER_KIB * GROWTH:
        return True, f"{long:.3f} ms/KiB at 16 KiB"
    short = cost_ms_per_kib(seed, 2)
    ok = long <= GROWTH * short + SLACK_MS_PER_KIB and long <= CEILING_MS_PER_KIB
    return ok, f"{long:.3f} ms/KiB at 16 KiB, {short:.3f} at 2 KiB"


def main() -> int:
    print(f"budget: 16 KiB at most {GROWTH:g}x the 2 KiB cost per KiB (+{SLACK_MS_PER_KIB} ms), "
          f"never over {CEILING_MS_PER_KIB} ms/KiB")  # fmt: skip
    failed = 0
    for seed in seeds():
        ok, figures = verdict(seed)
        failed += not ok
        print(f"  {'PASS' if ok else 'FAIL'} {seed!r}: {figures}")
    print("PASS" if not failed else f"FAIL ({failed} seed(s))")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

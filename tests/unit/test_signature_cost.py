"""A long adversarial line costs linear time in the catalog: a budget per KiB, not a wall-clock total.

The lines are built from the catalog itself: every pattern's anchor (the literal text the prefilter looks for)
repeated to fill the line, and NCCL's own record head repeated (a 16 KiB ``NCCL WARN`` line took 147 ms when
``NCCL WARN .*[Nn]o device found`` was retried from every ``NCCL WARN``). Each line is read as ``diagnose`` and
the logs check read it (judge.scan.Scanner, with the context rules). The budget is relative: the cost per KiB of
a 16 KiB line may be at most four times that of a 2 KiB line of the same text (quadratic cost is eight times), and
never more than an absolute ceiling far above linear and far below the old quadratic figure.
"""

from __future__ import annotations

import time

import pytest

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
        t0 = time.perf_counter()
        scanner = Scanner(catalog)
        scanner.feed(line)
        scanner.flush()
        catalog.match(line)
        best = min(best, time.perf_counter() - t0)
    return best * 1000 / kib


@pytest.mark.parametrize("seed", seeds())
def test_a_long_line_of_repeated_anchors_costs_linear_time(seed: str) -> None:
    long = cost_ms_per_kib(seed, 16)
    if long <= SLACK_MS_PER_KIB * GROWTH:
        return
    short = cost_ms_per_kib(seed, 2)
    assert long <= GROWTH * short + SLACK_MS_PER_KIB, f"{seed!r}: {long:.3f} ms/KiB at 16 KiB, {short:.3f} at 2 KiB"
    assert long <= CEILING_MS_PER_KIB, f"{seed!r}: {long:.3f} ms/KiB"

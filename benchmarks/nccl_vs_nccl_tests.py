"""The bundled all-reduce probe beside nccl-tests: busbw per message size, the ratio, and the accuracy targets.

    cd docs/h200/nccl-2026-11-30 && PYTHONPATH=../../../src python3 ../../../benchmarks/nccl_vs_nccl_tests.py \\
        --probe probe-nvlink-[12].txt --nccl-tests nccl-tests-nvlink-[12].txt --wall walls.txt

Each side may have several rounds (files); per size the best busbw over rounds and over out-of-place/in-place is
compared, as the figures in docs/h200 were. Targets: within 5 % of nccl-tests at every size from 1 MiB, within 2 %
from 64 MiB. Prints PASS/FAIL per size and exits 1 when any size misses its target. ``--wall FILE`` adds the quick
mode's wall-time lines (``quick ... wall_s=N``) against its 10 s target.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from dgxdoctor.sources.nccl_tests import parse_nccl_tests

MIB = 1 << 20
TARGETS = ((64 * MIB, 0.02), (MIB, 0.05))  # (from this size up, largest relative gap allowed)
QUICK_WALL_S = 10.0
WALL_RE = re.compile(r"^(?P<what>\S+) wall_s=(?P<s>[0-9.]+)")


def best_busbw(paths: list[Path]) -> dict[int, float]:
    best: dict[int, float] = {}
    for path in paths:
        for row in parse_nccl_tests(path.read_text(errors="replace")).rows:
            if row.busbw_gbps is not None:
                best[row.size_bytes] = max(best.get(row.size_bytes, 0.0), row.busbw_gbps)
    return best


def target_for(size: int) -> float | None:
    return next((gap for floor, gap in TARGETS if size >= floor), None)


def table(probe: dict[int, float], reference: dict[int, float]) -> tuple[list[str], bool]:
    lines = [f"{'size (B)':>12} {'probe GB/s':>11} {'nccl-tests GB/s':>16} {'ratio':>7} {'target':>8}  result"]
    ok = True
    for size in sorted(set(probe) & set(reference)):
        ratio = probe[size] / reference[size] if reference[size] > 0 else float("nan")
        gap = target_for(size)
        if gap is None:
            verdict, shown = "-", "-"
        else:
            passed = abs(ratio - 1) <= gap
            ok &= passed
            verdict, shown = ("PASS" if passed else "FAIL"), f"±{gap:.0%}"
        lines.append(f"{size:12d} {probe[size]:11.2f} {reference[size]:16.2f} {ratio:7.3f} {shown:>8}  {verdict}")
    return lines, ok


def walls(path: Path) -> tuple[list[str], bool]:
    lines, ok = [], True
    for raw in path.read_text().splitlines():
        m = WALL_RE.match(raw.strip())
        if m and m.group("what").startswith("quick"):
            seconds = float(m.group("s"))
            passed = seconds <= QUICK_WALL_S
            ok &= passed
            lines.append(
                f"{m.group('what')}: {seconds:.1f} s wall (target <= {QUICK_WALL_S:g} s) {'PASS' if passed else 'FAIL'}"
            )
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--probe", type=Path, nargs="+", required=True, help="probe outputs (one per round)")
    parser.add_argument("--nccl-tests", type=Path, nargs="+", required=True, help="nccl-tests outputs, same env")
    parser.add_argument("--wall", type=Path, help="file with 'quick... wall_s=N' lines")
    args = parser.parse_args(argv)
    lines, ok = table(best_busbw(args.probe), best_busbw(args.nccl_tests))
    print("\n".join(lines))
    if args.wall is not None:
        wall_lines, wall_ok = walls(args.wall)
        print("\n".join(wall_lines))
        ok &= wall_ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

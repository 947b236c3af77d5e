"""The figures both replays judge and print (benchmarks/replay.py on a fake clock, benchmarks/replay_deployed.py
through the deployed agents, issue 39): per fault class, how many faults were answered within the promised time,
how fast, and how many false restarts came under them; then PASS/FAIL against the issue's targets. Each replay
keeps its own catalogue, faults and the lines around the table."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol


class FaultClass(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def expect(self) -> str: ...

    @property
    def deadline_s(self) -> float: ...


class Fault(Protocol):
    @property
    def cls(self) -> FaultClass: ...

    @property
    def start(self) -> float: ...

    @property
    def answered_at(self) -> float | None: ...


def per_class(catalogue: Iterable[FaultClass], faults: Sequence[Fault], actions: Sequence[Mapping[str, Any]],
              missed: Callable[[Any], str]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Each class with faults injected: recall within its deadline, time to the answer, the false actions taken
    while one of its faults lasted, and ``missed(fault)`` for each fault not answered in time."""
    out: dict[str, dict[str, Any]] = {}
    for cls in catalogue:
        mine = [f for f in faults if f.cls is cls]
        if not mine:
            continue
        hit = [f for f in mine if f.answered_at is not None and f.answered_at - f.start <= cls.deadline_s]
        delays = sorted(f.answered_at - f.start for f in mine if f.answered_at is not None)
        restarts = [a for a in actions if cls.name in a["faults"] and a["verdict"] != "true"]
        out[cls.name] = {
            "injected": len(mine), "answered": len(hit), "recall": len(hit) / len(mine), "expect": cls.expect,
            "deadline_s": cls.deadline_s, "median_s": statistics.median(delays) if delays else None,
            "max_s": max(delays) if delays else None, "restarts": len(restarts),
            "missed": [missed(f) for f in mine if f not in hit],
        }  # fmt: skip
    return out


def verdicts(per: Mapping[str, Mapping[str, Any]], false_actions: int, node_days: float) -> dict[str, bool]:
    """The issue's targets, each met or not."""
    return {
        "false actions <= 1 per 1,000 node-days": not false_actions or false_actions / node_days * 1000 <= 1.0,
        "recall >= 95 % per class": all(c["recall"] >= 0.95 for c in per.values()),
        "0 restarts for faults a restart cannot cure": all(c["restarts"] == 0 for c in per.values()),
    }


def class_table(per: Mapping[str, Mapping[str, Any]], digits: int) -> list[str]:
    """The table of ``per_class``, times to ``digits`` decimals, up to three misses under each class's row."""
    w = 7 + digits  # the median and max columns: room for the decimals
    lines = [f"{'class':<16} {'expect':<16} {'recall':>8} {'within':>7} {'median':>{w}} {'max':>{w}} {'restarts':>8}"]
    for name, c in per.items():
        med = "-" if c["median_s"] is None else f"{c['median_s']:.{digits}f} s"
        mx = "-" if c["max_s"] is None else f"{c['max_s']:.{digits}f} s"
        lines.append(f"{name:<16} {c['expect']:<16} {c['answered']:>3}/{c['injected']:<4} {c['deadline_s']:>5.0f} s "
                     f"{med:>{w}} {mx:>{w}} {c['restarts']:>8}")  # fmt: skip
        lines += [f"    missed: {miss}" for miss in c["missed"][:3]]
    return lines


def verdict_lines(met: Mapping[str, bool]) -> list[str]:
    return [f"{'PASS' if ok else 'FAIL'}  {target}" for target, ok in met.items()]

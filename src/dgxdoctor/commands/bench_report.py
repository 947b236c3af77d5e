"""Render a benchmark sweep: the table, and the JSON, CSV and PNG files written beside the raw results.

The PNG needs matplotlib, an optional extra (``pip install 'dgxdoctor[plots]'``): it is imported only by
``write_png``, which only ``dgxdoctor bench`` calls; the agent never loads it.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dgxdoctor.judge.bench import Knee
from dgxdoctor.sources.vllm_bench import BenchPoint

CSV_FIELDS = (
    "concurrency",
    "num_prompts",
    "completed",
    "failed",
    "duration_s",
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
)


def sweep_dict(points: Sequence[BenchPoint], knee: Knee | None, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "settings": settings,
        "results": [p.to_dict() for p in sorted(points, key=lambda p: p.concurrency)],
        "knee": None
        if knee is None
        else {
            "concurrency": knee.concurrency,
            "found": knee.found,
            "reason": knee.reason,
            "recommended_max_num_seqs": knee.max_num_seqs,
        },
    }


def is_sweep_document(path: Path) -> bool:
    """Whether ``path`` is a sweep.json this module wrote (its three top-level keys)."""
    try:
        with path.open("rb") as fh:
            data = json.loads(fh.read(16 << 20))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and {"settings", "results", "knee"} <= data.keys()


def sweep_csv(points: Sequence[BenchPoint]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for p in sorted(points, key=lambda p: p.concurrency):
        writer.writerow(p.to_dict())
    return out.getvalue()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def sweep_text(points: Sequence[BenchPoint], knee: Knee | None) -> str:
    lines = [
        f"{'CONC':>5} {'OUT TOK/S':>10} {'REQ/S':>7} {'TTFT MEAN':>10} {'TTFT P99':>9} {'TPOT MEAN':>10} "
        f"{'TPOT P99':>9} {'FAILED':>6}"
    ]
    for p in sorted(points, key=lambda p: p.concurrency):
        mark = " <- knee" if knee is not None and knee.found and p.concurrency == knee.concurrency else ""
        lines.append(
            f"{p.concurrency:>5} {p.output_throughput:>10.1f} {p.request_throughput:>7.2f} {p.mean_ttft_ms:>10.1f} "
            f"{_ms(p.p99_ttft_ms):>9} {p.mean_tpot_ms:>10.1f} {_ms(p.p99_tpot_ms):>9} {p.failed:>6}{mark}"
        )
    if knee is not None:
        lines += [
            "",
            f"knee: concurrency {knee.concurrency}" if knee.found else "knee: not reached",
            f"  {knee.reason}",
        ]
        lines.append(
            f"recommended: --max-num-seqs {knee.max_num_seqs}"
            if knee.found
            else f"recommended: --max-num-seqs of at least {knee.max_num_seqs} (sweep higher to find the knee)"
        )
    return "\n".join(lines)


def write_png(points: Sequence[BenchPoint], knee: Knee | None, path: Path, title: str) -> None:
    """Output throughput and P99 TPOT against concurrency (log2 axis), the knee marked. ImportError without
    matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(points, key=lambda p: p.concurrency)
    xs = [p.concurrency for p in pts]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        ax.plot(xs, [p.output_throughput for p in pts], "o-", color="tab:blue", label="output tok/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("max concurrency")
        ax.set_ylabel("output throughput (tok/s)", color="tab:blue")
        ax2 = ax.twinx()
        tpot = [p.p99_tpot_ms if p.p99_tpot_ms is not None else p.mean_tpot_ms for p in pts]
        ax2.plot(xs, tpot, "s--", color="tab:red", label="TPOT P99 (ms)")
        ax2.set_ylabel("TPOT P99 (ms)", color="tab:red")
        if knee is not None and knee.found:
            ax.axvline(knee.concurrency, color="grey", linestyle=":")
            ax.annotate(
                f"knee: {knee.concurrency}\n--max-num-seqs {knee.max_num_seqs}",
                (knee.concurrency, max(p.output_throughput for p in pts)),
                textcoords="offset points",
                xytext=(6, -24),
            )
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def write_outputs(
    out_dir: Path, points: Sequence[BenchPoint], knee: Knee | None, settings: dict[str, Any], title: str
) -> tuple[list[Path], str | None]:
    """sweep.json, sweep.csv and sweep.png in ``out_dir``; (paths written, why the PNG was not)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "sweep.json", out_dir / "sweep.csv"]
    written[0].write_text(json.dumps(sweep_dict(points, knee, settings), indent=2) + "\n", encoding="utf-8")
    written[1].write_text(sweep_csv(points), encoding="utf-8")
    try:
        write_png(points, knee, out_dir / "sweep.png", title)
    except ImportError:
        return written, "PNG not written: matplotlib is not installed (pip install 'dgxdoctor[plots]')"
    return [*written, out_dir / "sweep.png"], None

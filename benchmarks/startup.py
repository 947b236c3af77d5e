"""Start-up of the commands an operator types: wall time and what each imports, beside a peer in the same run.

    PYTHONPATH=src .venv/bin/python benchmarks/startup.py [--runs 7] [--peer "nvidia-smi -L"]

Per command (``--help``, ``check``, ``diagnose`` of a small paste), the median and max wall time of ``--runs`` runs,
the ``python -X importtime`` cumulative total and the ten heaviest top-level imports, and whether the heavy modules
a command does not need were imported (the HTTP server, the scheduler, dashboards, plan and bench code). The peer is
a bare ``python -I -c pass`` (the interpreter's own start) and, with ``--peer``, any command (``nvidia-smi -L`` on a
GPU machine). Targets (issue: fast and small): ``--help`` <= 0.12 s and ``check`` <= 0.45 s here; ``--check-target``
sets the check target (0.6 s on the H200 with real NVML). Exit 1 on a miss.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Modules a command must not import unless it serves, schedules, draws, plans or benchmarks.
NOT_FOR_CHECK = ("aiohttp", "apscheduler", "dgxdoctor.daemon.app", "dgxdoctor.dashboards", "dgxdoctor.judge.plan",
                 "dgxdoctor.commands.bench", "matplotlib")  # fmt: skip
NOT_FOR_HELP = (*NOT_FOR_CHECK, "httpx", "pydantic", "dgxdoctor.checks.registry", "asyncio")
# "import time:       565 |      97687 |     pydantic"
IMPORTTIME_RE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def _env() -> dict[str, str]:
    """As installed: bytecode cached (pip compiles at install; PYTHONDONTWRITEBYTECODE would recompile every
    module at every start, ~10x the import time), the checkout's src first."""
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _wall(argv: list[str], runs: int, cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of each run; ``cpu`` gets each run's CPU seconds (user + sys), which a loaded machine barely
    moves."""
    times = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), check=False)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return times


def _imports(args: list[str]) -> tuple[float, list[tuple[float, str]], set[str]]:
    """(total seconds, the ten heaviest top-level imports, every module imported) of one run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dgxdoctor", *args],
        capture_output=True, text=True, env=_env(), check=False,
    )  # fmt: skip
    top: list[tuple[float, str]] = []
    modules: set[str] = set()
    total = 0.0
    for line in done.stderr.splitlines():
        m = IMPORTTIME_RE.match(line)
        if m is None:
            continue
        depth, module, cumulative = len(m.group(3)), m.group(4), int(m.group(2)) / 1e6
        modules.add(module)
        if depth == 1:  # a top-level import of the run
            total += cumulative
        if "." not in module or (module.startswith("dgxdoctor.") and module.count(".") == 1):
            top.append((cumulative, module))  # packages and dgxdoctor's own units
    heaviest = sorted((t, mod) for t, mod in top if mod not in ("dgxdoctor", "dgxdoctor.cli"))[::-1][:10]
    return total, heaviest, modules


def _report(name: str, argv: list[str], runs: int, target: float | None, forbidden: tuple[str, ...]) -> bool:
    _wall([sys.executable, "-m", "dgxdoctor", *argv], 1)  # writes the bytecode caches
    cpu: list[float] = []
    times = _wall([sys.executable, "-m", "dgxdoctor", *argv], runs, cpu)
    total, heaviest, modules = _imports(argv)
    median = statistics.median(times)
    verdict = "" if target is None else (" PASS" if median <= target else " FAIL") + f" (target {target:g} s)"
    print(
        f"\n{name}: median {median:.3f} s, max {max(times):.3f} s over {runs} runs{verdict}; "
        f"CPU (user + sys) median {statistics.median(cpu):.3f} s, min {min(cpu):.3f} s"
    )
    print(f"  imports: {total:.3f} s cumulative; heaviest: " + ", ".join(f"{m} {t * 1000:.0f} ms" for t, m in heaviest))
    loaded = sorted(f for f in forbidden if any(mod == f or mod.startswith(f + ".") for mod in modules))
    print("  needless imports: " + (", ".join(loaded) if loaded else "none"))
    return (target is None or median <= target) and not loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--peer", help="a command run beside, e.g. 'nvidia-smi -L'")
    parser.add_argument("--help-target", type=float, default=0.12)
    parser.add_argument("--check-target", type=float, default=0.45)
    parser.add_argument("--config", help="config for `check` (default: built-in defaults)")
    parser.add_argument("--check-arg", action="append", default=[], help="one more argument for `check` (repeat)")
    args = parser.parse_args()

    bare = statistics.median(_wall([sys.executable, "-I", "-c", "pass"], args.runs))
    print(f"peer: python -I -c pass: median {bare:.3f} s")
    if args.peer:
        peer = statistics.median(_wall(shlex.split(args.peer), args.runs))
        print(f"peer: {args.peer}: median {peer:.3f} s")
    check = ["check", *(["--config", args.config] if args.config else []), *args.check_arg]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as paste:
        paste.write("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n")
    try:
        ok = [
            _report("dgxdoctor --help", ["--help"], args.runs, args.help_target, NOT_FOR_HELP),
            _report("dgxdoctor check", check, args.runs, args.check_target, NOT_FOR_CHECK),
            _report("dgxdoctor diagnose", ["diagnose", paste.name], args.runs, None, NOT_FOR_CHECK),
        ]
    finally:
        os.unlink(paste.name)
    helped = statistics.median(_wall([sys.executable, "-m", "dgxdoctor", "--help"], args.runs))
    print(f"\nratio dgxdoctor --help / bare python: {helped / bare:.1f}")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())

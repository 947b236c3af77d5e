"""Start-up of the commands an operator types: wall time and what each imports, beside a peer in the same run.

    .venv/bin/python benchmarks/startup.py [--runs 7] [--peer "nvidia-smi -L"] [--python PATH]

By default dgxdoctor as the README installs it (``benchmarks/installed.py``: a cached ``python3 -m venv`` + ``pip
install .`` of this checkout, its ``dgxdoctor`` console script); ``--python PATH`` runs PATH with the checkout's src
on PYTHONPATH instead (the test venv, or a machine's own ``python3``).

Per command (``--help``, ``check``, ``diagnose`` of a small paste), the median and max wall time of ``--runs`` runs,
the ``python -X importtime`` cumulative total and the ten heaviest top-level imports, and whether the heavy modules
a command does not need were imported (the HTTP server, the scheduler, dashboards, plan and bench code). The peer is
a bare ``python -I -c pass`` (the interpreter's own start), the library floor (the same interpreter using only the
libraries of ``LIBRARY_FLOOR`` that a real ``check`` loaded, as little as a command can: a msgspec Struct validated
once, an httpx client for an http:// URL if check made one; what any ``check`` built on them would pay; runs
interleaved with check's, check's ratio to it printed) and, with ``--peer``, any command
(``nvidia-smi -L`` on a GPU machine). Targets (issue: fast and small): ``--help`` <= 0.12 s and ``check`` <= 0.45 s
here; ``--check-target`` sets the check target (0.6 s on the H200 with real NVML). Exit 1 on a miss.
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
from dataclasses import dataclass, field

from installed import Product, add_argument, resolve

# Modules a command must not import unless it serves, schedules, draws, plans or benchmarks.
NOT_FOR_CHECK = ("aiohttp", "apscheduler", "dgxdoctor.daemon.app", "dgxdoctor.dashboards", "dgxdoctor.judge.plan",
                 "dgxdoctor.commands.bench", "matplotlib")  # fmt: skip
NOT_FOR_HELP = (*NOT_FOR_CHECK, "httpx", "dgxdoctor.checks.registry", "asyncio")
# The libraries `check` cannot do without (its command line, records and config validation, HTTP client and event
# loop), used as little as a command built on them can: each step runs when the real command loaded the module
# beside it, as -X importtime shows. Importing is not enough: `import httpx` defers its machinery to the first
# client (httpcore and h11 come with it).
LIBRARY_FLOOR = (
    ("click", "import click"),
    ("msgspec", "import msgspec\nclass M(msgspec.Struct):\n    x: int = 0\nmsgspec.convert({'x': 1}, M)"),
    ("httpx", "import httpx"),
    # a client for an http:// URL: no CA bundle (dgxdoctor loads one for an https:// URL only)
    (
        "httpcore",
        "import ssl\nplain = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)\n"
        "httpx.Client(transport=httpx.HTTPTransport(verify=plain)).close()",
    ),
    ("asyncio", "import asyncio"),
)
# "import time:       565 |      97687 |     httpx"
IMPORTTIME_RE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def _once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + sys, which a loaded machine barely moves) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _wall(argv: list[str], runs: int, env: dict[str, str], cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of each run; ``cpu`` gets each run's CPU seconds."""
    times = []
    for _ in range(runs):
        wall, used = _once(argv, env)
        times.append(wall)
        if cpu is not None:
            cpu.append(used)
    return times


def _imports(product: Product, args: list[str]) -> tuple[float, list[tuple[float, str]], set[str]]:
    """(total seconds, the ten heaviest top-level imports, every module imported) of one run."""
    done = subprocess.run(
        product.command(*args, flags=["-X", "importtime"]),
        capture_output=True, text=True, env=product.env(), check=False,
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


@dataclass
class Measured:
    """A command's runs: wall and CPU seconds of each."""

    argv: list[str]
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)

    def run(self, env: dict[str, str]) -> None:
        wall, cpu = _once(self.argv, env)
        self.walls.append(wall)
        self.cpus.append(cpu)

    def line(self) -> str:
        return (
            f"median {statistics.median(self.walls):.3f} s, min {min(self.walls):.3f} s, max {max(self.walls):.3f} s; "
            f"CPU (user + sys) median {statistics.median(self.cpus):.3f} s, min {min(self.cpus):.3f} s"
        )


def _floor(product: Product, modules: set[str]) -> Measured | None:
    """The library floor: this interpreter taking the LIBRARY_FLOOR steps whose module the real command loaded."""
    steps = [step for module, step in LIBRARY_FLOOR if module in modules]
    return Measured([str(product.python), "-c", "\n".join(steps)]) if steps else None


def _report(product: Product, name: str, argv: list[str], runs: int, target: float | None,
            forbidden: tuple[str, ...], with_floor: bool = False) -> bool:  # fmt: skip
    env = product.env()
    _once(product.command(*argv), env)  # writes the bytecode caches (a README install has them already)
    total, heaviest, modules = _imports(product, argv)
    command = Measured(product.command(*argv))
    floor = _floor(product, modules) if with_floor else None
    for _ in range(runs):  # the floor's runs interleaved with the command's: the same load for both
        if floor is not None:
            floor.run(env)
        command.run(env)
    median = statistics.median(command.walls)
    verdict = "" if target is None else (" PASS" if median <= target else " FAIL") + f" (target {target:g} s)"
    print(f"\n{name}: {command.line()} over {runs} runs{verdict}")
    if floor is not None:
        own = median - statistics.median(floor.walls)
        code = floor.argv[2].replace("\n    ", " ").replace("\n", "; ")
        print(f"  library floor `{code}`: {floor.line()}")
        print(
            f"  ratio {name} / library floor: {median / statistics.median(floor.walls):.2f} wall, "
            f"{statistics.median(command.cpus) / statistics.median(floor.cpus):.2f} CPU; "
            f"dgxdoctor's own share {own:.3f} s of {median:.3f} s ({own / median:.0%})"
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
    add_argument(parser)
    args = parser.parse_args()
    product = resolve(args.python)
    print(product.describe())
    env = product.env()

    bare = statistics.median(_wall([str(product.python), "-I", "-c", "pass"], args.runs, env))
    print(f"peer: python -I -c pass: median {bare:.3f} s")
    if args.peer:
        peer = statistics.median(_wall(shlex.split(args.peer), args.runs, env))
        print(f"peer: {args.peer}: median {peer:.3f} s")
    check = ["check", *(["--config", args.config] if args.config else []), *args.check_arg]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as paste:
        paste.write("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n")
    try:
        ok = [
            _report(product, "dgxdoctor --help", ["--help"], args.runs, args.help_target, NOT_FOR_HELP),
            _report(product, "dgxdoctor check", check, args.runs, args.check_target, NOT_FOR_CHECK, with_floor=True),
            _report(product, "dgxdoctor diagnose", ["diagnose", paste.name], args.runs, None, NOT_FOR_CHECK),
        ]
    finally:
        os.unlink(paste.name)
    helped = statistics.median(_wall(product.command("--help"), args.runs, env))
    print(f"\nratio dgxdoctor --help / bare python: {helped / bare:.1f}")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())

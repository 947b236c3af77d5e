"""What loading the configuration costs, in CPU time (steadier than wall time on a shared machine).

    PYTHONPATH=src .venv/bin/python benchmarks/config_load.py [--runs 7]

Per step, the median over ``--runs`` fresh interpreters: ``import dgxdoctor.config`` (and whether it loaded any
check: it must not, since the registry is imported when a config is parsed), importing every check, building the
root model, validating the defaults and ``docs/config.example.toml``. The peer is ``import msgspec`` and a
one-field Struct validated once, the floor of any msgspec config. ``parse_config`` validates each table a config
names by its own model (``dgxdoctor.validation``); the others are their defaults, constructed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("msgspec", "config", "checks", "root", "defaults", "example")

PROBE = """
import json, sys, time
clock = time.process_time
out = {}
t = clock()
import msgspec, dgxdoctor.environment
class Peer(msgspec.Struct):
    x: int = 0
msgspec.convert({"x": 1}, Peer)
out["msgspec"] = clock() - t
t = clock(); import dgxdoctor.config as c; out["config"] = clock() - t
out["checks_at_import"] = sorted(m for m in sys.modules if m.startswith("dgxdoctor.checks."))
t = clock(); import dgxdoctor.checks.registry; out["checks"] = clock() - t
t = clock(); c.config_model(); out["root"] = clock() - t
t = clock(); c.parse_config({}); out["defaults"] = clock() - t
from dgxdoctor.compat import tomllib
data = tomllib.loads(open(EXAMPLE, encoding="utf-8").read())
t = clock(); c.parse_config(data, "example"); out["example"] = clock() - t
print(json.dumps(out))
"""


def _one() -> dict[str, object]:
    code = PROBE.replace("EXAMPLE", repr(str(REPO / "docs" / "config.example.toml")))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def report(runs: int) -> None:
    _one()  # writes the bytecode caches
    samples = [_one() for _ in range(runs)]
    print(f"\nCPU ms, median of {runs}")
    medians = {step: statistics.median(float(str(s[step])) for s in samples) * 1000 for step in STEPS}
    for step in STEPS:
        print(f"  {step:<9} {medians[step]:7.1f}")
    total = sum(v for k, v in medians.items() if k != "msgspec")
    print(f"  total     {total:7.1f} (beyond the peer, msgspec and one Struct: {medians['msgspec']:.1f})")
    print(f"  checks loaded by `import dgxdoctor.config`: {samples[0]['checks_at_import'] or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    report(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

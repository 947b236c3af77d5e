"""What loading the configuration costs, in CPU time (steadier than wall time on a shared machine).

    PYTHONPATH=src .venv/bin/python benchmarks/config_load.py [--runs 7]

Per step, the median over ``--runs`` fresh interpreters: ``import dgxdoctor.config`` (and whether it loaded any
check: it must not, since the registry is imported when a config is parsed), importing every check, building the
root model, validating the defaults and ``docs/config.example.toml``. The peer is ``import pydantic`` and a
one-field model (pydantic loads its schema machinery at the first), the floor of any pydantic config. The settings
models are deferred as shipped (``defer_build=True`` on settings.base.Frozen and CheckSettings) and
``parse_config`` validates each table a config names by its own model, the others being constructed defaults: a
config builds the schemas of the tables it names only, so ``defaults`` builds none and ``example`` (which names
nearly every table) carries the schema work that ``checks`` had while each model built its schema with its class.
``--defer-build`` repeats the run with ``defer_build=True`` on every pydantic model.
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
STEPS = ("pydantic", "config", "checks", "root", "defaults", "example")

PROBE = """
import json, sys, time, tomllib
clock = time.process_time
out = {}
t = clock()
import pydantic, dgxdoctor.environment
class Peer(pydantic.BaseModel):  # pydantic loads its schema machinery at the first model
    x: int = 0
out["pydantic"] = clock() - t
if DEFER:
    from pydantic import BaseModel
    BaseModel.model_config["defer_build"] = True  # the subclasses' configs merge this default
t = clock(); import dgxdoctor.config as c; out["config"] = clock() - t
out["checks_at_import"] = sorted(m for m in sys.modules if m.startswith("dgxdoctor.checks."))
t = clock(); import dgxdoctor.checks.registry; out["checks"] = clock() - t
t = clock(); c.config_model(); out["root"] = clock() - t
t = clock(); c.parse_config({}); out["defaults"] = clock() - t
data = tomllib.loads(open(EXAMPLE, encoding="utf-8").read())
t = clock(); c.parse_config(data, "example"); out["example"] = clock() - t
print(json.dumps(out))
"""


def _one(defer: bool) -> dict[str, object]:
    code = PROBE.replace("DEFER", repr(defer)).replace("EXAMPLE", repr(str(REPO / "docs" / "config.example.toml")))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def report(runs: int, defer: bool) -> None:
    _one(defer)  # writes the bytecode caches
    samples = [_one(defer) for _ in range(runs)]
    label = "defer_build=True" if defer else "as shipped"
    print(f"\n{label}: CPU ms, median of {runs}")
    medians = {step: statistics.median(float(str(s[step])) for s in samples) * 1000 for step in STEPS}
    for step in STEPS:
        print(f"  {step:<9} {medians[step]:7.1f}")
    total = sum(v for k, v in medians.items() if k != "pydantic")
    print(f"  total     {total:7.1f} (beyond the peer, pydantic and one model: {medians['pydantic']:.1f})")
    print(f"  checks loaded by `import dgxdoctor.config`: {samples[0]['checks_at_import'] or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--defer-build", action="store_true", help="also measure pydantic's defer_build=True")
    args = parser.parse_args()
    report(args.runs, defer=False)
    if args.defer_build:
        report(args.runs, defer=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Requests lost to a restart, cold (today's) beside drained (out of rotation first), behind a real HAProxy.

Two replicas, each a real vLLM (CPU build, the tiny model) watched by its own dgxdoctor in act mode, behind Debian's
HAProxy reading each agent's agent-check port; four clients post completions that each last seconds
(tests/integration/drain_rig.py). Per scenario, on replica A:

- planned restart, drained: ``dgxdoctor remediation restart --drain``;
- planned restart, cold: ``dgxdoctor remediation restart`` with HAProxy not reading the agents (its own TCP check of
  vLLM's port only, as before dgxdoctor spoke to balancers);
- hung engine, drained: A's engine SIGSTOPped; dgxdoctor finds ENGINE_HUNG, the agent says down, the restart leaves
  rotation first;
- hung engine, cold: the same with ``[remediation] drain = false`` and HAProxy not reading the agents.

Printed per scenario: requests sent, failed, failed after A left HAProxy's rotation, seconds from the fault (or the
restart asked) to A out of rotation, seconds from the fault to the first good completion served by A again, and
PASS/FAIL for the drained ones (planned: 0 failed; hung: out within 30 s, 0 failed after it). About 4 minutes.

    PYTHONPATH=src .venv/bin/python benchmarks/drain.py [--only planned|hung]

Exit 1 when a drained scenario fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from drain_rig import Figures, Rig, hung_engine, planned, rig, set_drain, wait_for, why_not_runnable  # noqa: E402


def _row(f: Figures, verdict: str) -> str:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    return (f"{f.scenario:<28} {f.sent:>5} {f.failed:>7} {f.failed_after_out:>13} {num(f.out_s):>9} "
            f"{num(f.first_good_s):>12}  {verdict}")  # fmt: skip


def _failures(f: Figures) -> None:
    """Each failed request: when it was sent (Unix time), how it failed, which server answered (if any)."""
    for r in f.failures:
        print(f"    failed: sent {r.sent:.1f}, {r.error}, server {r.server or '-'}, after {r.done - r.sent:.1f} s")


def _cold(the_rig: Rig, cold: bool) -> None:
    the_rig.balancer.agents(not cold)
    for r in (the_rig.a, the_rig.b):
        set_drain(r, not cold)
    wait_for(the_rig.all_in_rotation, 300, "both replicas in rotation", poll=0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("planned", "hung"), help="run one kind of scenario")
    args = parser.parse_args()
    why = why_not_runnable()
    if why is not None:
        print(f"cannot run: {why}")
        return 2
    rows: list[str] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="dgxdoctor-drain-") as tmp, rig(Path(tmp)) as the_rig:
        if args.only in (None, "planned"):
            for drain in (True, False):
                _cold(the_rig, cold=not drain)
                figures, _ = planned(the_rig, drain)
                ok = figures.failed == 0
                failed |= drain and not ok
                rows.append(_row(figures, ("PASS" if ok else "FAIL") if drain else "baseline"))
                print(rows[-1], flush=True)
                _failures(figures)
        if args.only in (None, "hung"):
            for drain in (True, False):
                _cold(the_rig, cold=not drain)
                figures, _, _ = hung_engine(the_rig, settle_s=5)
                figures.scenario = f"hung engine, {'drained' if drain else 'cold'}"
                ok = figures.failed_after_out == 0 and figures.out_s is not None and figures.out_s <= 30
                failed |= drain and not ok
                rows.append(_row(figures, ("PASS" if ok else "FAIL") if drain else "baseline"))
                print(rows[-1], flush=True)
                _failures(figures)
    print()
    print(f"{'scenario':<28} {'sent':>5} {'failed':>7} {'after out':>13} {'out (s)':>9} {'first good':>12}  verdict")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

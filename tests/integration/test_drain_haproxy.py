"""Out of rotation before every restart, proven with real parts: HAProxy (Debian's) in front of two replicas, each a
real vLLM (CPU build, the tiny model) watched by its own dgxdoctor in act mode, HAProxy reading each agent's
agent-check port; a load generator posts completions that each last seconds through HAProxy and records every one
(tests/integration/drain_rig.py).

(a) a planned drained restart of A (`dgxdoctor remediation restart --drain`): no request fails;
(b) A's engine stopped (SIGSTOP, /health still 200): A is out of HAProxy's rotation within 10 s of dgxdoctor's
    finding and 30 s of the stop, no request sent after it left fails, A is restarted and back, B served throughout;
(c) the requests of (b) that failed were all in flight before A left rotation: counted and reported.

Both vLLMs start at once (the module's one rig), each replica's processes on a core of its own as each replica has
machines of its own: about 2.5 minutes. A failed assertion prints each failed request beside HAProxy's own log lines
on it and on the servers' states.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from drain_rig import Figures, Rig, hung_engine, planned, rig, why_not_runnable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(why_not_runnable() is not None, reason=str(why_not_runnable())),
]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with rig(Path(tmp_path_factory.mktemp("drain"))) as the_rig:
        yield the_rig


def test_a_planned_drained_restart_loses_no_request(replicas: Rig) -> None:
    figures, done = planned(replicas, drain=True)
    print(f"\n(a) {figures}")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line.split()[0] for line in done.stdout.splitlines()[1:] if line.startswith("  ")]
    assert steps[:2] == ["leave_rotation", "drain"] and steps[-2:] == ["verify", "rejoin"], done.stdout
    assert "drained: 0 running, 0 waiting" in done.stdout
    assert figures.out_s is not None and figures.out_s < 10, figures
    assert figures.sent >= 8 and figures.failed == 0, _explain(figures, replicas)
    started = [e for e in replicas.a.audit() if e["event"] == "action_started"]
    assert started[-1]["requested_by"] == "operator"


def test_a_stopped_engine_leaves_rotation_is_restarted_and_only_its_in_flight_requests_fail(replicas: Rig) -> None:
    figures, found, out = hung_engine(replicas)
    print(f"\n(b) {figures}; found ENGINE_HUNG at {found}; left rotation at {out}")
    print(f"(c) failed: {figures.failed} of {figures.sent}, after leaving rotation: {figures.failed_after_out}; "
          f"{[(round(f.sent - out, 1), f.error, f.server) for f in figures.failures]}")  # fmt: skip
    assert found is not None, "the daemon's /state never showed ENGINE_HUNG"
    assert out - found <= 10, f"out of rotation {out - found:.1f} s after the finding"
    assert figures.out_s is not None and figures.out_s <= 30, figures
    assert figures.failed_after_out == 0, _explain(figures, replicas)
    assert all(f.sent < out for f in figures.failures), _explain(figures, replicas)  # (c): only in flight on A
    assert figures.first_good_s is not None  # A restarted and serving again
    action = next(e for e in reversed(replicas.a.audit()) if e["event"] == "action")
    assert action["outcome"] == "success" and action["problem"] == "check:vllm:restart_vllm"
    drain = next(s for s in action["steps"] if s["step"] == "drain")
    assert "cannot drain" in drain["detail"], drain
    assert not [r for r in figures.failures if r.server == "b"], _explain(figures, replicas)  # B served throughout
    assert figures.b_while_out >= 4, figures  # and it took A's share while A was out


def _explain(figures: Figures, the_rig: Rig) -> str:
    """Each failed request beside HAProxy's own words on it and on the servers' states."""
    failed = [(round(f.sent, 1), round(f.done - f.sent, 1), f.error, f.server) for f in figures.failures]
    trouble = "\n".join(the_rig.balancer_trouble()[-40:])
    return f"{figures}\nfailed (sent, took, error, server): {failed}\nHAProxy:\n{trouble}"

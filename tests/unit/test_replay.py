"""The replay harness's short version (benchmarks/replay.py, issue 39): two nodes, the real remediation engine in act
mode on a fake clock, fed benign life and one fault of every class the docs promise an answer for. Every fault is
answered (its restart or its page) within its promised time, nothing is restarted without a fault behind it, no
restart runs while a fault a restart cannot cure lasts, and no page goes out with no fault open. And the harness
is no tautology: with ``hold_s = 0`` the benign slow ``/health`` becomes a false restart it counts."""

from __future__ import annotations

from types import ModuleType

from conftest import load_benchmark


def replay() -> ModuleType:
    return load_benchmark("replay")


def test_every_fault_class_is_answered_in_time_and_nothing_healthy_is_restarted() -> None:
    r = replay()
    fig = r.simulate({"ray": 0.8, "mp": 0.3}, 1, seed=39, gap_s=5400)
    per = fig.per_class()
    assert set(per) == {c.name for c in r.CATALOGUE}
    assert {name: c["recall"] for name, c in per.items()} == dict.fromkeys(per, 1.0), r.report(fig)
    assert fig.false_actions == [], r.report(fig)
    assert all(c["restarts"] == 0 for c in per.values() if c["expect"] == "page")
    assert all(fig.verdicts().values())
    # Every page has a fault behind it: none cites a log line or a worker's result from before a cured restart.
    assert [p for p in fig.pages if not p["faults"]] == [], r.report(fig)


def test_without_hold_a_slow_health_is_a_false_restart_the_harness_counts() -> None:
    r = replay()
    fig = r.simulate({"ray": 1.0}, 0, seed=39, settings={"hold_s": 0})
    assert fig.false_actions, r.report(fig)
    assert all(a["verdict"] == "false: no fault behind it" for a in fig.false_actions)
    assert not fig.verdicts()["false actions <= 1 per 1,000 node-days"]

"""The guard: every limit, in the order an operator expects, and its state surviving a restart."""

from __future__ import annotations

from typing import Any

from dgxdoctor.config import RemediationSettings
from dgxdoctor.remediation.guard import Guard, GuardState
from dgxdoctor.remediation.policy import Problem
from dgxdoctor.validation import validate

VLLM = Problem("check:vllm:restart_vllm", "restart_vllm", "check", "VLLM_DEAD: refused")
RAY = Problem("check:ray:restart_cluster", "restart_cluster", "check", "RAY_NODE_DEAD")


def guard(**kw: Any) -> Guard:
    base: dict[str, Any] = {"mode": "act", "role": "head", "hold_s": 10, "vllm_start_grace_s": 60, "budget": 2}
    return Guard(validate(RemediationSettings, {**base, **kw}))


def seen(g: Guard, problem: Problem, at: float) -> None:
    g.observe([problem], at, "check")


def test_observe_mode_decides_what_act_mode_decides() -> None:
    """Observe mode is act mode's dry run: the guard decides the same (the engine records "would X" where it says
    act); the worker's refusal of a cluster restart, the hold and the grace are observe mode's answers too."""
    for mode in ("observe", "act"):
        g = guard(mode=mode)
        seen(g, VLLM, 0)
        assert g.decide(VLLM, 5, None).verdict == "hold"
        assert g.decide(VLLM, 100, vllm_uptime_s=30).verdict == "hold"
        assert (g.decide(VLLM, 100, None).verdict, g.decide(VLLM, 100, None).action) == ("act", "restart_vllm")
        w = guard(mode=mode, role="worker")
        seen(w, RAY, 0)
        refused = w.decide(RAY, 100, None)
        assert refused.verdict == "refuse" and "orchestrated by the head" in refused.reason
    roleless = guard(mode="observe", role=None)  # observe mode without [node] role: what act mode could not do
    seen(roleless, RAY, 0)
    refused = roleless.decide(RAY, 100, None)
    assert refused.verdict == "refuse" and "no [node] role" in refused.reason


def test_a_rehearsal_spends_what_the_action_would_and_act_mode_forgets_it() -> None:
    g = guard(mode="observe", cooldown_s={"restart_vllm": 300, "restart_cluster": 0, "page": 0})
    seen(g, VLLM, 0)
    g.rehearse(g.decide(VLLM, 10, None), 10)
    st = g.state
    assert st.in_flight is None and st.finished_at == 10 and st.dry_run and g.budget_used(10) == 1
    seen(g, VLLM, 11)  # still there: nothing was restarted
    d = g.decide(VLLM, 21, None)
    assert (d.verdict, d.action) == ("act", "restart_cluster")  # the ladder's next step, as after a real restart
    restored = Guard(g.settings, GuardState.from_doc(g.state.to_doc()))
    assert restored.state.dry_run and restored.forget_dry_run()
    assert restored.budget_used(21) == 0 and restored.state.attempts == {} and not restored.state.dry_run


def test_a_restart_that_could_not_run_is_no_ladder_step() -> None:
    g = guard(cooldown_s={"restart_vllm": 0, "restart_cluster": 0, "page": 0})
    seen(g, VLLM, 0)
    g.begin(g.decide(VLLM, 10, None), "a1", 10, 1)
    g.finish(11, ran=False)
    seen(g, VLLM, 12)
    d = g.decide(VLLM, 30, None)
    assert (d.verdict, d.action) == ("act", "restart_vllm") and g.budget_used(30) == 1


def test_hold_then_act_then_cooldown() -> None:
    g = guard()
    seen(g, VLLM, 0)
    assert g.decide(VLLM, 5, None).verdict == "hold"
    d = g.decide(VLLM, 10, None)
    assert d.verdict == "act" and d.action == "restart_vllm"
    g.begin(d, "a1", 10, 1)
    assert g.decide(VLLM, 11, None).verdict == "refuse"  # one at a time
    g.finish(20)
    seen(g, VLLM, 21)  # the episode ended: the condition must hold again
    assert g.decide(VLLM, 25, None).verdict == "hold"


def test_the_ladder_pages_only_for_a_recurrence_that_held() -> None:
    """A restart ends the episode: what is seen again afterwards must hold ``hold_s`` before the ladder pages, as
    before any restart (one check run catching a worker still starting is no sign the restart did not cure)."""
    g = guard(cooldown_s={"restart_vllm": 0, "restart_cluster": 0, "page": 0})
    seen(g, RAY, 0)
    d = g.decide(RAY, 10, None)
    assert (d.verdict, d.action) == ("act", "restart_cluster")
    g.begin(d, "x", 10, 1)
    g.finish(20)
    seen(g, RAY, 21)  # one run says it again: held, not paged
    d = g.decide(RAY, 21, None)
    assert (d.verdict, d.action) == ("hold", "page") and "hold_s" in d.reason
    g.observe([], 23, "check")  # the next run no longer does: the blip ended, nothing is owed
    seen(g, RAY, 25)
    assert g.decide(RAY, 30, None).verdict == "hold"
    assert g.decide(RAY, 35, None).verdict == "page"  # held 10 s: the restart did not cure it


def test_start_grace_holds_while_vllm_loads() -> None:
    g = guard()
    seen(g, VLLM, 0)
    d = g.decide(VLLM, 100, vllm_uptime_s=30)
    assert d.verdict == "hold" and "grace" in d.reason
    assert g.decide(VLLM, 100, vllm_uptime_s=61).verdict == "act"


def test_ladder_then_budget_opens_the_breaker_until_reset() -> None:
    g = guard(cooldown_s={"restart_vllm": 0, "restart_cluster": 0, "page": 0})
    t = 0.0
    for expected in ("restart_vllm", "restart_cluster"):
        seen(g, VLLM, t)
        d = g.decide(VLLM, t + 10, None)
        assert (d.verdict, d.action) == ("act", expected)
        g.begin(d, expected, t + 10, 1)
        g.finish(t + 20)
        t += 30
    seen(g, VLLM, t)
    d = g.decide(VLLM, t + 10, None)
    assert (d.verdict, d.action) == ("page", "page")  # the ladder ends at a page, nothing runs
    g2 = guard(budget=1, cooldown_s={"restart_vllm": 0, "restart_cluster": 0, "page": 0})
    seen(g2, RAY, 0)
    d = g2.decide(RAY, 10, None)
    g2.begin(d, "x", 10, 1)
    g2.finish(20)
    seen(g2, RAY, 20)
    g2.state.attempts.clear()  # a different problem, same budget
    d = g2.decide(RAY, 40, None)
    assert d.verdict == "refuse" and g2.state.breaker_open
    assert g2.decide(RAY, 10_000, None).verdict == "refuse"  # stays open after the window
    g2.reset()
    assert not g2.state.breaker_open and g2.budget_used(10_000) == 0


def test_only_the_head_orchestrates_cluster_restarts() -> None:
    g = guard(role="worker")
    seen(g, RAY, 0)
    d = g.decide(RAY, 100, None)
    assert d.verdict == "refuse" and "head" in d.reason


def test_state_round_trips_with_an_action_in_flight() -> None:
    g = guard()
    seen(g, VLLM, 0)
    d = g.decide(VLLM, 10, None)
    g.begin(d, "a1", 10, 4242)
    again = GuardState.from_doc(g.state.to_doc())
    assert again.in_flight is not None and again.in_flight.id == "a1" and again.in_flight.pid == 4242
    assert again.last == {"restart_vllm": 10} and again.attempts == g.state.attempts
    assert GuardState.from_doc({}) == GuardState()


def test_a_condition_that_clears_starts_over() -> None:
    g = guard()
    seen(g, VLLM, 0)
    g.observe([], 5, "check")
    seen(g, VLLM, 8)
    assert g.decide(VLLM, 12, None).verdict == "hold"

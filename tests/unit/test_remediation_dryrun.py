"""Observe mode is act mode's dry run: the same findings and alerts at the same (fake) times give the same decisions
in both modes, with "would X" where act mode runs X. Act mode runs a fake ``systemctl`` that succeeds and cures
nothing (the check still sees the dead vLLM), so both walk the guard's hold, start grace, one action at a time,
ladder, page cooldown and budget; vLLM, Ray's dashboard and Alertmanager are answered at the HTTP boundary."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from dgxdoctor.alerts.webhook import IncomingAlert
from dgxdoctor.checks.vllm import VLLM_PROCESS_UPTIME
from dgxdoctor.config import AlertsSettings, RemediationSettings
from dgxdoctor.daemon.remediation import make_pager
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.result import CheckResult, Finding, Sample, Status
from dgxdoctor.validation import validate

FIXTURES = Path(__file__).parent.parent / "fixtures"
T0 = 1_000_000.0
LIMITS: dict[str, Any] = {"hold_s": 10, "vllm_start_grace_s": 60, "budget": 2, "ladder_window_s": 200,
                          "cooldown_s": {"restart_vllm": 100, "restart_cluster": 0, "page": 1000},
                          "verify_timeout_s": 1, "ray_ready_timeout_s": 1}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def services(seen: list[str]) -> httpx.MockTransport:
    """vLLM healthy once restarted, Ray's dashboard with both nodes and 16 GPUs, Alertmanager taking pages."""
    nodes = (FIXTURES / "ray" / "healthy-nodes-detail.json").read_bytes()

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
        if path == "/api/v0/nodes":
            return httpx.Response(200, content=nodes)
        if path == "/api/v2/alerts":
            return httpx.Response(200)
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def fake_systemctl(tmp_path: Path) -> tuple[Path, Path]:
    """A ``systemctl`` that records its argv and succeeds (restarting nothing)."""
    calls = tmp_path / "calls"
    script = tmp_path / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    script.chmod(0o755)
    return script, calls


def remediator(state: Path, mode: str, role: str, clock: Clock, results: dict[str, CheckResult],
               seen: list[str]) -> Remediator:  # fmt: skip
    systemctl, _ = fake_systemctl(state)
    unit = [str(systemctl)]
    commands = {"restart_vllm": [*unit, "restart", "vllm.service"], "stop_vllm": [*unit, "stop", "vllm.service"],
                "start_vllm": [*unit, "start", "vllm.service"], "ray_stop": [*unit, "stop", "ray-head.service"],
                "ray_start": [*unit, "start", "ray-head.service"]}  # fmt: skip
    settings = validate(RemediationSettings, {"mode": mode, "role": role, **LIMITS, "commands": commands})
    targets = Targets(VllmTarget("http://vllm:8000", "tiny"), "http://ray:8265", 2, 16, (), "t" * 16)
    env = Environment(node="dgx-a", http_transport=services(seen))
    pager = make_pager(AlertsSettings(alertmanager_url="http://am:9093"), env)
    return Remediator(settings, pager, "dgx-a", state, targets, lambda: results, clock=clock, env=env)


def dead_vllm(started_at: float, uptime_s: float) -> CheckResult:
    finding = judged(Finding("VLLM_DEAD", Status.CRITICAL, "connection refused"))
    uptime = Sample(VLLM_PROCESS_UPTIME, uptime_s)
    return CheckResult("vllm", Status.CRITICAL, "dead", (finding,), (uptime,), started_at=started_at)


def ray_dead(started_at: float) -> CheckResult:
    finding = judged(Finding("RAY_NODE_DEAD", Status.CRITICAL, "node 10.77.0.2 DEAD"))
    return CheckResult("ray", Status.CRITICAL, "a node is dead", (finding,), started_at=started_at)


VLLM_DOWN = IncomingAlert("firing", {"alertname": "DgxdoctorVllmDown", "node": "dgx-a",
                          "dgxdoctor_action": "restart_vllm"}, "f1", "2026-12-05T09:00:00Z", T0 + 20)  # fmt: skip


async def run(r: Remediator, clock: Clock, results: dict[str, CheckResult], sequence: list[Any]) -> None:
    """Each step: at time T0 + t the checks' latest results (and the alerts delivered then), one evaluation, and
    act mode's action (if any) run to its end before the clock moves on."""
    for t, latest, alerts in sequence:
        clock.now = T0 + t
        results.clear()
        results.update(latest)
        if alerts:
            r.accept_alerts(alerts)
        await r.evaluate()
        if r.acting is not None:
            await r.acting


def decisions(state: Path) -> list[tuple[float, str, str, str, str]]:
    """(when, problem, action, verdict, reason) of each decision, observe mode's "would X" read as act mode's."""
    out = []
    for e in AuditLog(state).tail(1000):
        if e["event"] != "decision":
            continue
        verdict, reason = e["verdict"], e["reason"]
        if verdict == "observe":
            assert e["mode"] == "observe"
            would = re.fullmatch(r'would (\S+) \(mode = "observe"\): (.*)', reason)
            assert would is not None and would[1] == e["action"], e
            verdict, reason = ("page" if e["action"] == "page" else "act"), would[2]
        out.append((e["ts"], e["problem"], e["action"], verdict, reason))
    return out


async def test_observe_mode_decides_what_act_mode_does_at_the_same_times(tmp_path: Path) -> None:
    sequence = [
        (0, {"vllm": dead_vllm(T0 - 1, 30)}, []),  # hold_s
        (15, {"vllm": dead_vllm(T0 + 14, 45)}, []),  # vLLM still loading: the start grace
        (40, {"vllm": dead_vllm(T0 + 39, 70)}, [VLLM_DOWN]),  # restart_vllm for the check; the alert waits its turn
        (50, {"vllm": dead_vllm(T0 + 49, 80)}, []),  # back after the restart: must hold again; the ladder's next step
        (61, {"vllm": dead_vllm(T0 + 60, 91)}, []),  # restart_cluster
        (70, {"vllm": dead_vllm(T0 + 69, 100)}, []),  # back again: must hold again
        (81, {"vllm": dead_vllm(T0 + 80, 111)}, []),  # held: the ladder ends, page
        (90, {"vllm": dead_vllm(T0 + 89, 120)}, []),  # the page's cooldown
        (300, {"vllm": dead_vllm(T0 + 299, 330)}, []),  # the ladder's window passed: restart_vllm, over budget
        (320, {"vllm": dead_vllm(T0 + 319, 350)}, []),  # the breaker stays open
    ]
    audits = {}
    for mode in ("act", "observe"):
        state, seen, clock, results = tmp_path / mode, [], Clock(), {}
        state.mkdir()
        r = remediator(state, mode, "head", clock, results, seen)
        await run(r, clock, results, sequence)
        audits[mode] = (decisions(state), seen, state)
        assert r.metrics()["breaker_open"] is (mode == "act")  # a rehearsed breaker stopped nothing: no alert
    act, observe = audits["act"][0], audits["observe"][0]
    assert observe == act
    verdicts = [(t - T0, action, verdict) for t, _, action, verdict, _ in act]
    assert verdicts == [
        (0, "restart_vllm", "hold"), (15, "restart_vllm", "hold"), (40, "restart_vllm", "act"),
        (40, "restart_vllm", "refuse"), (50, "restart_cluster", "hold"), (61, "restart_cluster", "act"),
        (70, "page", "hold"), (81, "page", "page"), (90, "page", "hold"), (300, "restart_vllm", "refuse"),
        (320, "restart_vllm", "refuse"),
    ]  # fmt: skip
    assert "breaker opened" in act[-2][4] and "breaker open (" in act[-1][4]
    assert "one action at a time" in act[3][4] and "grace" in act[1][4]
    # Act mode ran the commands and sent the page; observe mode ran nothing and sent nothing.
    act_calls = (audits["act"][2] / "calls").read_text().splitlines()
    assert act_calls == ["restart vllm.service", "stop vllm.service", "stop ray-head.service",
                         "start ray-head.service", "start vllm.service"]  # fmt: skip
    assert not (audits["observe"][2] / "calls").exists() and audits["observe"][1] == []
    assert "POST /api/v2/alerts" in audits["act"][1]
    (page,) = [e for e in AuditLog(audits["observe"][2]).tail(100) if e["event"] == "page"]
    assert page["outcome"] == "not_sent" and "ladder ended" in page["reason"]
    kinds = {e["event"] for e in AuditLog(audits["observe"][2]).tail(100)}
    assert "action_started" not in kinds and "action" not in kinds
    state_doc = guard_state_file(audits["observe"][2]).read()
    assert state_doc["breaker"]["open"] and state_doc["dry_run"] is True


async def test_a_worker_in_observe_mode_gives_act_modes_refusal(tmp_path: Path) -> None:
    """The worker logged "would restart_cluster", which act mode refuses: now both refuse, for the same reason."""
    sequence = [(0, {"ray": ray_dead(T0 - 1)}, []), (20, {"ray": ray_dead(T0 + 19)}, [])]
    seen: dict[str, list[tuple[float, str, str, str, str]]] = {}
    for mode in ("act", "observe"):
        state, clock, results = tmp_path / mode, Clock(), {}
        state.mkdir()
        r = remediator(state, mode, "worker", clock, results, [])
        await run(r, clock, results, sequence)
        seen[mode] = decisions(state)
    assert seen["observe"] == seen["act"]
    assert [(v, a) for _, _, a, v, _ in seen["act"]] == [("refuse", "restart_cluster")]  # said once, not per tick
    assert "orchestrated by the head" in seen["act"][0][4]


async def test_act_mode_forgets_what_observe_mode_rehearsed(tmp_path: Path) -> None:
    """Turning act on after observing: the budget, cooldowns, ladder steps and breaker of actions that never ran are
    forgotten (audited), so the first real fault gets the first real restart."""
    clock, results = Clock(), {}
    observer = remediator(tmp_path, "observe", "head", clock, results, [])
    await run(observer, clock, results, [(0, {"vllm": dead_vllm(T0 - 1, 1000)}, []),
                                         (11, {"vllm": dead_vllm(T0 + 10, 1000)}, [])])  # fmt: skip
    assert guard_state_file(tmp_path).read()["last"] == {"restart_vllm": T0 + 11}
    observer.reconfigure(remediator(tmp_path, "act", "head", clock, results, []))
    await run(observer, clock, results, [(40, {"vllm": dead_vllm(T0 + 39, 1000)}, []),
                                         (51, {"vllm": dead_vllm(T0 + 50, 1000)}, [])])  # fmt: skip
    audit = AuditLog(tmp_path).tail(100)
    assert [e["event"] for e in audit] == ["decision", "decision", "reset", "decision", "decision", "action_started",
                                           "action"]  # fmt: skip
    assert audit[1]["verdict"] == "observe" and audit[2]["by"] == "mode change" and "never ran" in audit[2]["detail"]
    assert (audit[4]["verdict"], audit[4]["action"]) == ("act", "restart_vllm")  # not the ladder's restart_cluster
    assert "dry_run" not in guard_state_file(tmp_path).read()  # written only while set: the format as before

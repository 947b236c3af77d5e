"""The remediation loop with real commands (argv lists) in a temporary state dir; vLLM and Alertmanager are
answered by an httpx transport at the HTTP boundary (the end-to-end tests run the real ones)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from dgxdoctor.alerts.webhook import IncomingAlert
from dgxdoctor.config import AlertsSettings, RemediationSettings
from dgxdoctor.daemon.remediation import make_pager
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.actions import VllmTarget, step_mac
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.remediation.policy import OLD_EVIDENCE
from dgxdoctor.result import CheckResult, Finding, Status
from dgxdoctor.validation import validate

# As the check runner hands them on: with what follows from each finding (judge.consequence).
DEAD = CheckResult("vllm", Status.CRITICAL, "dead", (judged(Finding("VLLM_DEAD", Status.CRITICAL, "refused")),))


def vllm_app(requests: list[str], healthy: bool = True) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(f"{request.method} {request.url.path}")
        if request.url.path == "/health":
            return httpx.Response(200 if healthy else 503)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
        if request.url.path == "/api/v2/alerts":
            requests.append(request.content.decode())
            return httpx.Response(200)
        return httpx.Response(404)

    return httpx.MockTransport(handle)


async def test_back_after_a_restart_climbs_the_ladder_into_the_breaker(tmp_path: Path) -> None:
    results = {"vllm": DEAD}
    r = remediator(tmp_path, vllm_app([]), results, budget=1)
    await settle(r)
    results["vllm"] = CheckResult("vllm", Status.CRITICAL, "dead", DEAD.findings, started_at=r.clock() + 1)
    await settle(r)
    last = events(tmp_path)[-1]
    assert (last["verdict"], last["action"]) == ("refuse", "restart_cluster") and "breaker opened" in last["reason"]
    assert r.metrics()["breaker_open"] and guard_state_file(tmp_path).read()["breaker"]["open"]


def remediator(
    tmp_path: Path, transport: httpx.BaseTransport, results: dict[str, CheckResult], **kw: Any
) -> Remediator:
    cfg: dict[str, Any] = {
        "mode": "act",
        "role": "head",
        "hold_s": 0,
        "vllm_start_grace_s": 0,
        "verify_timeout_s": 1,
        "drain": False,
    }  # the cold restart; the drained one: test_drain.py
    cfg["commands"] = {"restart_vllm": ["true"], **kw.pop("commands", {})}
    settings = validate(RemediationSettings, {**cfg, **kw})
    targets = Targets(VllmTarget("http://vllm:8000", "tiny"), "http://ray:8265", 2, 16, (), "t" * 16)
    env = Environment(node="dgx-a", http_transport=transport)
    pager = make_pager(AlertsSettings(alertmanager_url="http://am:9093"), env)
    return Remediator(settings, pager, "dgx-a", tmp_path, targets, lambda: results, env=env)


async def settle(r: Remediator, limit_s: float = 30.0) -> None:
    """Evaluate, then wait until no action is running or in flight; a test whose action never ends fails here."""
    await r.evaluate()

    async def idle() -> None:
        while r.busy.locked() or guard_state_file(r.state_file.path.parent).read().get("in_flight") is not None:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(idle(), limit_s)


def events(tmp_path: Path) -> list[dict[str, Any]]:
    return AuditLog(tmp_path).tail(100)


async def test_a_dead_vllm_is_restarted_verified_and_audited(tmp_path: Path) -> None:
    seen: list[str] = []
    r = remediator(tmp_path, vllm_app(seen), {"vllm": DEAD})
    await settle(r)
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds == ["decision", "action_started", "action"]
    action = events(tmp_path)[-1]
    assert action["outcome"] == "success" and action["steps"][0]["argv"] == ["true"]
    assert action["verification"]["ok"] is True
    assert seen == ["GET /health", "GET /v1/models", "POST /v1/chat/completions"]
    assert {k: n for k, n in r.metrics()["actions"].items() if n} == {("restart_vllm", "success"): 1}
    await r.evaluate()  # the result from before the restart is stale: nothing new
    assert len(events(tmp_path)) == 3


async def test_a_failed_verification_is_a_failed_action(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([], healthy=False), {"vllm": DEAD})
    await settle(r)
    action = events(tmp_path)[-1]
    assert action["outcome"] == "failed" and "not healthy" in action["verification"]["detail"]


async def test_a_failing_command_stops_before_verification(tmp_path: Path) -> None:
    seen: list[str] = []
    r = remediator(tmp_path, vllm_app(seen), {"vllm": DEAD}, commands={"restart_vllm": ["false"]})
    await settle(r)
    (action,) = [e for e in events(tmp_path) if e["event"] == "action"]
    assert action["outcome"] == "failed" and action["steps"][0]["returncode"] == 1
    assert "GET /health" not in seen  # no verification of a restart that did not run


async def test_a_restart_that_could_not_run_pages_at_once_and_is_no_ladder_step(tmp_path: Path) -> None:
    """``/bin/false`` as the restart: said as such and paged at once with that text; 11 s later the problem still
    there is no cluster restart ("restarts did not cure it"): the same restart, after its cooldown."""
    seen: list[str] = []
    now = [1_000_000.0]
    results = {"vllm": CheckResult("vllm", Status.CRITICAL, "dead", DEAD.findings, started_at=now[0] - 1)}
    r = remediator(tmp_path, vllm_app(seen), results, commands={"restart_vllm": ["/bin/false"]})
    r.clock = lambda: now[0]
    await settle(r)
    action, page = events(tmp_path)[-2:]
    assert (action["event"], action["outcome"], action["detail"]) == ("action", "failed",
                                                                      "restart_vllm could not run: exit 1")  # fmt: skip
    assert (page["event"], page["outcome"], page["reason"]) == ("page", "sent", "restart_vllm could not run: exit 1")
    (posted,) = json.loads(seen[-1])
    assert posted["annotations"]["description"] == "restart_vllm could not run: exit 1"
    assert "did not cure" not in posted["annotations"]["description"]
    now[0] += 11
    results["vllm"] = CheckResult("vllm", Status.CRITICAL, "dead", DEAD.findings, started_at=now[0] - 1)
    await settle(r)
    last = events(tmp_path)[-1]
    assert (last["event"], last["action"], last["verdict"]) == ("decision", "restart_vllm", "hold"), last
    assert "cooldown" in last["reason"]
    now[0] += 300
    results["vllm"] = CheckResult("vllm", Status.CRITICAL, "dead", DEAD.findings, started_at=now[0] - 1)
    await settle(r)
    tried = [e["action"] for e in events(tmp_path) if e["event"] == "action_started"]
    assert tried == ["restart_vllm", "restart_vllm"] and r.counts[("restart_vllm", "failed")] == 2


async def test_a_command_that_could_not_run_is_named_with_its_stderr(tmp_path: Path) -> None:
    unit_missing = ["sh", "-c", "echo 'Failed to start ray-head.service: Unit ray-head.service not found.' >&2; exit 5"]
    ray_dead = CheckResult("ray", Status.CRITICAL, "dead", (judged(Finding("RAY_NODE_DEAD", Status.CRITICAL, "x")),))
    seen: list[str] = []
    r = remediator(tmp_path, vllm_app(seen), {"ray": ray_dead}, commands={"ray_start": unit_missing,
                   "stop_vllm": ["true"], "ray_stop": ["true"], "start_vllm": ["true"]})  # fmt: skip
    await settle(r)
    action, page = events(tmp_path)[-2:]
    said = (
        "restart_cluster could not run: start_ray_head exit 5: Failed to start ray-head.service: Unit "
        "ray-head.service not found."
    )
    assert action["detail"] == said and page["reason"] == said and page["outcome"] == "sent"
    assert [s["step"] for s in action["steps"]] == ["stop:stop_vllm", "stop:stop_ray_head", "start_ray_head"]


async def test_a_restart_that_ran_and_did_not_cure_is_no_could_not_run(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([], healthy=False), {"vllm": DEAD}, verify_timeout_s=0.1)
    await settle(r)
    action = events(tmp_path)[-1]
    assert action["event"] == "action" and action["outcome"] == "failed" and "detail" not in action


async def test_observe_mode_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD}, mode="observe",
                   commands={"restart_vllm": ["touch", str(marker)]})  # fmt: skip
    for _ in range(3):
        await settle(r)
    assert not marker.exists()
    assert [e["verdict"] for e in events(tmp_path)] == ["observe"]  # logged once, not every evaluation


async def test_an_interrupted_action_is_recorded_and_not_repeated(tmp_path: Path) -> None:
    now = 1_000_000.0
    guard_state_file(tmp_path).write(
        {"in_flight": {"id": "abc", "action": "restart_vllm", "key": "check:vllm:restart_vllm", "started_at": now - 5,
                       "pid": 99999}, "last": {"restart_vllm": now - 5}, "actions": [{"action": "restart_vllm",
                       "at": now - 5}], "attempts": {}, "onset": {}}
    )  # fmt: skip
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD})
    r.clock = lambda: now
    r.recover()
    record = events(tmp_path)[0]
    results_now = CheckResult("vllm", Status.CRITICAL, "dead", DEAD.findings, started_at=now + 1)
    r.latest = lambda: {"vllm": results_now}
    assert (record["event"], record["outcome"], record["id"]) == ("action", "interrupted", "abc")
    assert guard_state_file(tmp_path).read()["in_flight"] is None
    await settle(r)
    assert "cooldown" in events(tmp_path)[-1]["reason"]  # not blindly repeated


async def test_webhook_alerts_are_idempotent_per_fingerprint(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([]), {})
    labels = {"alertname": "DgxdoctorVllmDown", "node": "dgx-a", "dgxdoctor_action": "restart_vllm"}
    alert = IncomingAlert("firing", labels, "f1", "2026-11-30T10:00:00Z", 1.0)
    other = IncomingAlert("firing", {**labels, "node": "dgx-b"}, "f2", "2026-11-30T10:00:00Z", 1.0)
    assert r.accept_alerts([alert, other]) == (1, 1)
    assert r.accept_alerts([alert]) == (0, 1)  # Alertmanager's repeat: the same firing episode
    await settle(r)
    assert [e["event"] for e in events(tmp_path)] == ["decision", "action_started", "action"]
    assert r.accept_alerts([alert]) == (0, 1)


async def test_ladder_end_pages_through_alertmanager(tmp_path: Path) -> None:
    seen: list[str] = []
    cooldowns = {"restart_vllm": 0, "restart_cluster": 0, "page": 3600}
    r = remediator(tmp_path, vllm_app(seen), {"vllm": DEAD}, ladder_window_s=3600, cooldown_s=cooldowns)
    now = r.clock()
    tried = [{"action": "restart_vllm", "at": now - 60}, {"action": "restart_cluster", "at": now - 30}]
    guard_state_file(tmp_path).write({"attempts": {"restart_vllm": tried}})
    await settle(r)
    page = events(tmp_path)[-1]
    assert page["event"] == "page" and page["outcome"] == "sent" and "ladder ended" in page["reason"]
    posted = json.loads(seen[-1])
    assert posted[0]["labels"]["alertname"] == "DgxdoctorRemediationPage" and posted[0]["labels"]["node"] == "dgx-a"
    await settle(r)
    assert [e["event"] for e in events(tmp_path)].count("page") == 1  # the page's cooldown


async def test_hardware_faults_are_suggested_not_paged_twice(tmp_path: Path) -> None:
    seen: list[str] = []
    r = remediator(tmp_path, vllm_app(seen), {"infiniband": CheckResult("infiniband", Status.CRITICAL, "x", (
        judged(Finding("IB_PORT_DOWN", Status.CRITICAL, "mlx5_0/1 down")),))})  # fmt: skip
    await settle(r)
    (decision,) = events(tmp_path)
    assert (decision["verdict"], decision["action"]) == ("suggest", "page") and seen == []


def step_request(step: str, action_id: str, sent_at: float | None = None, token: str = "t" * 16) -> dict[str, Any]:
    """What the head's ``ask_worker`` sends: the step, the action, when, and their HMAC under the token."""
    ts = round(time.time() if sent_at is None else sent_at, 6)
    return {"step": step, "id": action_id, "ts": ts, "mac": step_mac(token, step, action_id, ts)}


async def test_worker_runs_only_its_own_steps_when_acting(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    r = remediator(tmp_path, vllm_app([]), {}, role="worker", commands={"ray_stop": ["touch", str(marker)]})
    assert (await r.run_step(step_request("rm -rf /", "0123456789ab")))[0] == 400
    status, answer = await r.run_step(step_request("ray_stop", "0123456789ab"))
    assert status == 200 and answer["ok"] and marker.exists()
    observer = remediator(tmp_path / "o", vllm_app([]), {}, mode="observe", role="worker")
    assert (await observer.run_step(step_request("ray_stop", "0123456789ac")))[0] == 409


@pytest.mark.parametrize("doc", ["[]", "{not json"])
def test_a_corrupt_state_file_is_an_error_not_a_reset(tmp_path: Path, doc: str) -> None:
    (tmp_path / "remediation-state.json").write_text(doc)
    with pytest.raises(ValueError):
        guard_state_file(tmp_path).read()


async def test_an_alert_older_than_the_last_action_is_stale(tmp_path: Path) -> None:
    """An alert that began firing during a restart describes the world before the restart ended: never acted on."""
    r = remediator(tmp_path, vllm_app([]), {})
    labels = {"alertname": "DgxdoctorVllmDown", "node": "dgx-a", "dgxdoctor_action": "restart_vllm"}
    now = r.clock()
    guard_state_file(tmp_path).write({"finished_at": now - 10})
    r.finished_at = now - 10
    assert r.accept_alerts([IncomingAlert("firing", labels, "f1", "t1", now - 60)]) == (1, 0)
    await settle(r)
    assert [(e["event"], e["verdict"], e["reason"]) for e in events(tmp_path)] == [("decision", "hold", OLD_EVIDENCE)]
    assert r.accept_alerts([IncomingAlert("firing", labels, "f1", "t2", now - 1)]) == (1, 0)  # fired again since
    await settle(r)
    assert [e["event"] for e in events(tmp_path)][1:] == ["decision", "action_started", "action"]

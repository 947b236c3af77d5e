"""The guarded restart drains first: out of rotation, wait for vLLM's requests (or the timeout), capture, restart,
verify, rejoin, each step audited; a hung engine is not waited for. An operator's planned restart goes through the
same guard and audit over the daemon's real HTTP app. The shipped units stop vLLM with time to finish."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from conftest import REPO
from dgxdoctor.config import RemediationSettings
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.audit import AuditLog
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.remediation.policy import Problem
from dgxdoctor.result import CheckResult, Finding, Status
from dgxdoctor.settings.daemon import Credentials
from dgxdoctor.validation import validate

PEER = "p" * 32


class Vllm:
    """vLLM's HTTP face: ``in_flight`` requests that finish one per /metrics read, or never (``stuck``)."""

    def __init__(self, in_flight: int, stuck: bool = False, sneaks: tuple[int, ...] = ()) -> None:
        self.in_flight = in_flight
        self.stuck = stuck
        self.seen: list[str] = []
        self.sneaks = sneaks  # /metrics readings before which a short request came and went (tokens counted)
        self.tokens = 100

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            self.seen.append(request.url.path)
            if request.url.path == "/metrics":
                running = self.in_flight
                if self.seen.count("/metrics") in self.sneaks:
                    self.tokens += 7
                if not self.stuck:
                    self.in_flight = max(self.in_flight - 1, 0)
                return httpx.Response(200, text=(
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}\n'
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0\n'
                    "# TYPE vllm:prompt_tokens_total counter\n"
                    f'vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {self.tokens}\n'))  # fmt: skip
            if request.url.path == "/health":
                return httpx.Response(200)
            if request.url.path == "/v1/models":
                return httpx.Response(200, json={"data": [{"id": "tiny"}]})
            if request.url.path == "/v1/chat/completions":
                return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
            return httpx.Response(404)

        return httpx.MockTransport(handle)


def remediator(tmp: Path, vllm: Vllm, results: dict[str, CheckResult], **kw: Any) -> tuple[Remediator, list[str]]:
    cfg: dict[str, Any] = {"mode": "act", "role": "head", "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 1,
                           "balancer_period_s": 0.2, "drain_timeout_s": 5, "rejoin_timeout_s": 2,
                           "commands": {"restart_vllm": ["true"]}, **kw}  # fmt: skip
    env = Environment(node="dgx-a", http_transport=vllm.transport())
    targets = Targets(VllmTarget("http://vllm:8000", "tiny"), "http://ray:8265", 2, 16, (), "t" * 16)
    r = Remediator(validate(RemediationSettings, cfg), None, "dgx-a", tmp, targets, lambda: results, env=env)
    held: list[str] = []
    r.rotation.on_change = lambda: held.append(r.rotation.current or "released")
    r.rotation.ready = lambda: "ready"
    return r, held


def action(tmp: Path) -> dict[str, Any]:
    return next(e for e in reversed(AuditLog(tmp).tail(100)) if e["event"] == "action")


async def until_done(r: Remediator, tmp: Path) -> dict[str, Any]:
    await r.evaluate()
    while r.busy.locked() or r.acting is None or not r.acting.done():
        await asyncio.sleep(0.02)
    return action(tmp)


async def test_a_planned_drained_restart_leaves_waits_restarts_verifies_and_rejoins(tmp_path: Path) -> None:
    vllm = Vllm(in_flight=3)
    r, held = remediator(tmp_path, vllm, {})
    status, record = await r.planned_restart(drain=True)
    assert status == 200 and record["outcome"] == "success" and record["drained"] is True
    steps = [(s["step"], s["ok"]) for s in record["steps"]]
    assert steps == [("leave_rotation", True), ("drain", True), ("restart_vllm", True), ("verify", True),
                     ("rejoin", True)]  # fmt: skip
    assert re.match(r"drained: 0 running, 0 waiting after \d", record["steps"][1]["detail"])
    assert vllm.seen.count("/metrics") >= 7  # 3, 2, 1, then 0 for DRAIN_QUIET_S (1 s of 0.25 s polls)
    assert held == ["draining", "restarting", "released"]
    assert r.rotation.current is None
    m = r.metrics()
    assert m["drains"]["drained"] == 1 and m["drain_s_total"] >= 0.2 and m["last_drain_s"] is not None
    started = [e for e in AuditLog(tmp_path).tail(100) if e["event"] == "action_started"]
    assert started[-1]["requested_by"] == "operator" and started[-1]["problem"] == "operator:restart_vllm"


async def test_a_request_between_two_empty_readings_is_not_drained_yet(tmp_path: Path) -> None:
    """A balancer that has not seen the drain yet still sends: 0 in flight at each reading, tokens counted between."""
    vllm = Vllm(in_flight=0, sneaks=(3,))
    r, _ = remediator(tmp_path, vllm, {})
    _, record = await r.planned_restart(drain=True)
    assert record["steps"][1]["detail"].startswith("drained: 0 running, 0 waiting")
    assert vllm.seen.count("/metrics") >= 7  # tokens moved before the 3rd reading: quiet from it, 1 s on


async def test_the_drain_timeout_restarts_with_requests_in_flight_and_says_so(tmp_path: Path) -> None:
    r, _ = remediator(tmp_path, Vllm(in_flight=2, stuck=True), {}, drain_timeout_s=0.6)
    status, record = await r.planned_restart(drain=True)
    assert status == 200 and record["outcome"] == "success"
    assert "drain_timeout_s 0.6 s reached with 2 requests in flight" in record["steps"][1]["detail"]
    assert r.metrics()["drains"]["timeout"] == 1


async def test_a_hung_engine_is_not_drained_the_balancer_period_is_waited(tmp_path: Path) -> None:
    hung = CheckResult("vllm", Status.CRITICAL, "hung",
                       (judged(Finding("ENGINE_HUNG", Status.CRITICAL, "no step for 16 s")),))  # fmt: skip
    vllm = Vllm(in_flight=4, stuck=True)
    r, held = remediator(tmp_path, vllm, {"vllm": hung})
    record = await until_done(r, tmp_path)
    assert record["outcome"] == "success" and record["problem"] == "check:vllm:restart_vllm"
    drain = record["steps"][1]
    assert drain["step"] == "drain" and drain["duration_s"] >= 0.2
    assert (
        "the engine is hung and cannot drain; waited the balancer's period (0.2 s), restarting without waiting"
        in (drain["detail"])
    )
    assert "/metrics" not in vllm.seen  # nothing waited for
    assert held == ["draining", "restarting", "released"] and r.metrics()["drains"]["hung"] == 1


async def test_a_cluster_restart_over_a_hung_engine_does_not_wait_for_its_requests(tmp_path: Path) -> None:
    hung = CheckResult("vllm", Status.CRITICAL, "hung", (judged(Finding("ENGINE_HUNG", Status.CRITICAL, "")),))
    vllm = Vllm(in_flight=4, stuck=True)
    r, _ = remediator(tmp_path, vllm, {"vllm": hung}, drain_timeout_s=30)
    alert = Problem("alert:DgxdoctorNcclFailure:restart_cluster", "restart_cluster", "alert", "alert firing")
    steps = await asyncio.to_thread(r._leave_and_drain, alert)
    assert steps[-1].step == "drain" and steps[-1].detail.startswith("ENGINE_HUNG: the engine is hung")
    assert "/metrics" not in vllm.seen and steps[-1].duration_s < 5


async def test_a_failed_verification_releases_the_hold_and_leaves_readiness_to_the_checks(tmp_path: Path) -> None:
    r, held = remediator(tmp_path, Vllm(in_flight=0), {}, commands={"restart_vllm": ["false"]})
    _, record = await r.planned_restart(drain=True)
    assert record["outcome"] == "failed" and held[-1] == "released"
    assert [s["step"] for s in record["steps"]] == ["leave_rotation", "drain", "restart_vllm", "rejoin"]


async def test_a_cold_planned_restart_does_not_leave_rotation(tmp_path: Path) -> None:
    r, held = remediator(tmp_path, Vllm(in_flight=1), {})
    status, record = await r.planned_restart(drain=False)
    assert status == 200 and [s["step"] for s in record["steps"]] == ["restart_vllm", "verify"] and held == []


async def test_the_planned_restart_goes_through_the_guard(tmp_path: Path) -> None:
    r, _ = remediator(tmp_path, Vllm(in_flight=0), {}, budget=1)
    assert (await r.planned_restart(drain=False))[0] == 200
    status, answer = await r.planned_restart(drain=False)
    assert status == 409 and "budget of 1 actions" in answer["detail"]
    observe, _ = remediator(tmp_path / "observe", Vllm(in_flight=0), {}, mode="observe")
    status, answer = await observe.planned_restart(drain=True)
    assert status == 409 and 'mode = "observe"' in answer["detail"]
    decisions = [e for e in AuditLog(tmp_path).tail(100) if e["event"] == "decision"]
    assert decisions[-1]["verdict"] == "refuse" and decisions[-1]["source"] == "operator"


async def test_the_restart_endpoint_takes_only_the_peer_token(tmp_path: Path) -> None:
    r, _ = remediator(tmp_path, Vllm(in_flight=1), {})
    state = AppState(ResultStore("dgx-a"), CollectorRegistry(), lambda: {"healthy": True},
                     Credentials(read="r" * 32, peer=PEER), restart=r.planned_restart)  # fmt: skip
    async with TestClient(TestServer(make_app(state))) as client:
        assert (await client.post("/remediation/restart", json={"drain": True})).status == 401
        read = {"Authorization": "Bearer " + "r" * 32}
        assert (await client.post("/remediation/restart", json={"drain": True}, headers=read)).status == 403
        peer = {"Authorization": f"Bearer {PEER}"}
        assert (await client.post("/remediation/restart", json={"drain": "yes"}, headers=peer)).status == 400
        answer = await client.post("/remediation/restart", json={"drain": True}, headers=peer)
        assert answer.status == 200 and (await answer.json())["outcome"] == "success"


def test_the_shipped_units_stop_vllm_with_time_to_finish_in_flight_requests() -> None:
    for name in ("vllm.service", "vllm-head-mp.service", "vllm-worker-mp.service"):
        text = (REPO / "systemd" / name).read_text()
        grace = re.search(r"^ExecStart=.*--shutdown-timeout (\d+)", text, re.M)
        stop = re.search(r"^TimeoutStopSec=(\d+)$", text, re.M)
        assert grace and stop and int(stop[1]) > int(grace[1]) > 0, name
        assert re.search(r"^KillSignal=SIGTERM$", text, re.M), name

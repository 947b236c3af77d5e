"""The readiness signal: the judge's verdict, the hysteresis on the way back, ``GET /ready`` over real HTTP (no token,
one word) and HAProxy's agent-check over a real TCP socket; its metrics present from the start."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dgxdoctor.checks.vllm import VLLM_SECONDS_SINCE_PROGRESS
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.daemon.readiness import AgentServer, Readiness, add_routes
from dgxdoctor.exporters.readiness import ReadinessCollector
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.judge.consequence import judged
from dgxdoctor.judge.hardware_cause import peer_cause_findings
from dgxdoctor.judge.readiness import Hold, verdict
from dgxdoctor.result import CheckResult, Finding, Sample, Status
from dgxdoctor.settings.daemon import Credentials
from dgxdoctor.settings.readiness import ReadinessSettings
from dgxdoctor.validation import validate

SUSPECT_S = 5.0


def vllm(started: float, stall_s: float = 0.0, *findings: Finding) -> CheckResult:
    status = max((f.status for f in findings), key=lambda s: s.value == "critical", default=Status.OK)
    return CheckResult("vllm", status, "vllm", tuple(judged(f) for f in findings),
                       (Sample(VLLM_SECONDS_SINCE_PROGRESS, stall_s),), started_at=started)  # fmt: skip


HUNG = Finding("ENGINE_HUNG", Status.CRITICAL, "no engine step for 16 s while 3 running")
DEAD = Finding("VLLM_DEAD", Status.CRITICAL, "connection refused")


@pytest.mark.parametrize(
    ("results", "state"),
    [
        ({}, "down"),  # no source: never ready
        ({"vllm": CheckResult.unknown("vllm", "timed out")}, "down"),
        ({"vllm": vllm(1, 0.0, DEAD)}, "down"),
        ({"vllm": vllm(1, 0.0, Finding("VLLM_LOADING", Status.OK, "started 20 s ago, loading"))}, "down"),
        ({"vllm": vllm(1, 16.0, HUNG)}, "down"),
        ({"vllm": vllm(1, 6.0, Finding("ENGINE_NO_PROGRESS", Status.WARNING, "6 s"))}, "suspect"),
        ({"vllm": vllm(1, 2.0, Finding("ENGINE_NO_PROGRESS", Status.WARNING, "2 s"))}, "ready"),  # a short gap
        ({"vllm": vllm(1)}, "ready"),
        (
            {
                "vllm": vllm(1),
                "ray": CheckResult(
                    "ray", Status.CRITICAL, "", (judged(Finding("RAY_NODE_DEAD", Status.CRITICAL, "10.0.0.2 DEAD")),)
                ),
            },
            "down",
        ),  # a peer worker down
        (
            {
                "vllm": vllm(1),
                "ras": CheckResult(
                    "ras", Status.CRITICAL, "", (Finding("RAS_RANK_DEAD", Status.CRITICAL, "rank 9 dead"),)
                ),
            },
            "down",
        ),
        (
            {
                "vllm": vllm(1),
                "peer_compare": CheckResult(
                    "peer_compare",
                    Status.WARNING,
                    "",
                    tuple(
                        peer_cause_findings(
                            {
                                "node": "dgx-b",
                                "checks": [
                                    {
                                        "findings": [
                                            {
                                                "code": "XID_79",
                                                "status": "critical",
                                                "subject": "0000:3b:00",
                                                "cure": "hardware",
                                            }
                                        ]
                                    }
                                ],
                            },
                            "http://dgx-b:9835",
                        )
                    ),
                ),
            },
            "down",
        ),
        (
            {
                "vllm": vllm(1),
                "xid": CheckResult(
                    "xid", Status.CRITICAL, "", (judged(Finding("KERNEL_AER_FATAL", Status.CRITICAL, "fatal AER")),)
                ),
            },
            "down",
        ),  # a hardware cause here
    ],
)
def test_verdict(results: dict[str, CheckResult], state: str) -> None:
    assert verdict(results, None, SUSPECT_S).state == state


@pytest.mark.parametrize("hold", ["draining", "restarting"])
def test_a_hold_wins(hold: Hold) -> None:
    assert verdict({"vllm": vllm(1)}, hold, SUSPECT_S).state == hold


class World:
    def __init__(self, need: int = 2) -> None:
        self.results: dict[str, CheckResult] = {}
        self.hold: Hold | None = None
        self.now = 1000.0
        self.rechecks = 0
        settings = ReadinessSettings(ready_after_good=need, suspect_after_s=SUSPECT_S)

        def recheck() -> None:
            self.rechecks += 1

        self.r = Readiness(lambda: settings, lambda: self.results, lambda: self.hold, recheck, lambda: self.now)

    def run(self, *findings: Finding, stall_s: float = 0.0) -> str:
        """A new vllm check run: it begins now, the store gets it a second later."""
        started = self.now
        self.now += 1
        self.results["vllm"] = vllm(started, stall_s, *findings)
        return self.r.evaluate().state


def test_leaving_is_at_once_and_coming_back_takes_good_runs_in_a_row() -> None:
    w = World(need=2)
    assert w.r.state == "down"  # before any result
    assert (w.run(), w.run()) == ("down", "ready")  # two good runs
    assert w.run(HUNG, stall_s=16) == "down"  # at once
    assert w.r.evaluate().state == "down"
    assert w.run() == "down" and "recovering: 1 of 2" in w.r.current.reason
    assert w.r.evaluate().state == "down"  # the same run evaluated again counts once
    assert w.run(Finding("ENGINE_NO_PROGRESS", Status.WARNING, ""), stall_s=6) == "suspect"  # the count starts over
    assert (w.run(), w.run()) == ("suspect", "ready")  # progress resumed: back without a restart
    m = w.r.metrics()
    assert m["changes"] == {"ready": 2, "suspect": 1, "draining": 0, "restarting": 0, "down": 1}
    assert m["recoveries"] == 1 and m["last_recover_s"] == 4.0  # one incident: down, suspect, ready


def test_a_result_from_before_the_restart_never_brings_the_node_back() -> None:
    w = World(need=1)
    assert w.run() == "ready"
    w.hold = "draining"
    assert w.r.evaluate().state == "draining"
    w.hold = "restarting"
    stale = CheckResult("vllm", Status.OK, "", (), (Sample(VLLM_SECONDS_SINCE_PROGRESS, 0.0),), started_at=w.now)
    w.now += 5
    assert w.r.evaluate().state == "restarting"
    w.hold = None  # released; the run that began during the restart is no evidence of the new process
    w.results["vllm"] = stale
    assert w.r.evaluate().state == "restarting"
    w.now += 1
    assert w.run() == "ready"


async def test_the_loop_reruns_the_vllm_check_while_out_and_not_held() -> None:
    w = World()
    w.run(DEAD)
    w.now += 10
    w.r.start()
    await asyncio.sleep(1.3)
    assert w.rechecks >= 1
    w.hold, before = "restarting", w.rechecks
    await asyncio.sleep(1.1)
    await w.r.stop()
    assert w.rechecks == before  # a restart in progress: nothing to recheck


async def test_ready_over_http_needs_no_token_and_says_one_word(tmp_path: Path) -> None:
    w = World(need=1)
    state = AppState(ResultStore("dgx-a"), CollectorRegistry(), lambda: {"healthy": True},
                     Credentials(read="r" * 32, peer="p" * 32))  # fmt: skip
    state.extra_routes = lambda app: add_routes(app, w.r)
    async with TestClient(TestServer(make_app(state))) as client:
        w.run(HUNG, stall_s=20)
        answer = await client.get("/ready")
        assert (answer.status, await answer.text()) == (503, "down\n")  # no code, no message
        w.run()
        answer = await client.get("/ready")
        assert (answer.status, await answer.text()) == (200, "ready\n")
        assert (await client.get("/state")).status == 401  # the rest still wants its token


async def test_agent_check_answers_one_line_and_closes() -> None:
    w = World(need=1)
    agent = AgentServer(w.r)
    await agent.start("127.0.0.1", 0)
    assert agent.address is not None

    async def ask() -> bytes:
        reader, writer = await asyncio.open_connection(*agent.address)
        line = await asyncio.wait_for(reader.read(), 5)  # read() to EOF: the agent closes after its line
        writer.close()
        return line

    try:
        assert await ask() == b"down #down: starting: no vllm check result yet\n"
        w.run()
        assert await ask() == b"up ready\n"
        w.run(Finding("ENGINE_NO_PROGRESS", Status.WARNING, ""), stall_s=7.5)
        assert (await ask()).startswith(b"drain #suspect: no engine progress for 7.5 s")
        w.hold = "restarting"
        w.r.evaluate()
        assert await ask() == b"maint #restarting: a restart in progress\n"
    finally:
        await agent.stop()


def test_metrics_exist_from_the_start() -> None:
    w = World()
    registry = CollectorRegistry()
    registry.register(ReadinessCollector(lambda: "dgx-a", w.r.metrics))
    from prometheus_client import generate_latest

    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    states = {s.labels["state"]: s.value for s in families["dgxdoctor_readiness_state"].samples}
    assert states == {"ready": 0, "suspect": 0, "draining": 0, "restarting": 0, "down": 1}
    changes: dict[str, Any] = {s.labels["state"]: s.value for s in families["dgxdoctor_readiness_changes"].samples
                               if s.name.endswith("_total")}  # fmt: skip
    assert set(changes.values()) == {0.0} and len(changes) == 5
    assert families["dgxdoctor_ready"].samples[0].value == 0
    assert families["dgxdoctor_serving_recoveries"].samples[0].value == 0
    assert math.isnan(families["dgxdoctor_serving_last_recover_seconds"].samples[0].value)


@pytest.mark.parametrize("table", [{"ready_after_good": 0}, {"ready_after_good": 10**9}, {"suspect_after_s": math.inf},
                                   {"recheck_s": 0}, {"agent_listen": "nowhere"}])  # fmt: skip
def test_settings_are_bounded(table: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        validate(ReadinessSettings, table)

"""What remediation trusts: its config (act mode needs a token), its state file (validated; a bad one set aside,
the breaker open), its disk (a failed audit write leaves nothing in flight), the webhook (bounded, replay-safe)
and the head's step requests (signed, windowed, under the worker's own breaker and budget)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_remediation_engine import DEAD, events, remediator, settle, step_request, vllm_app

from conftest import run_cli
from dgxdoctor.alerts.webhook import IncomingAlert
from dgxdoctor.config import ConfigError, load_config, parse_config
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon
from dgxdoctor.remediation import intake
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.engine import STOP_WAIT_S
from dgxdoctor.remediation.guard import GuardState
from dgxdoctor.remediation.state_doc import StateDocError
from dgxdoctor.remediation.status import render_status, status_document
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.statefile import WRITE_ERRORS

TOKEN = "trust-token-0123456789"
VLLM_DOWN = {"alertname": "DgxdoctorVllmDown", "node": "dgx-a", "dgxdoctor_action": "restart_vllm"}


# -- config ----------------------------------------------------------------------------------------------


def test_act_mode_without_a_token_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"remediation": {"mode": "act", "role": "head"}})
    ((where, why),) = caught.value.problems
    assert where == "remediation.mode" and "daemon.alert_token_file" in why and "peer_token_file" in why
    parse_config({"remediation": {"mode": "act", "role": "head"}, "daemon": {"token": TOKEN}})
    parse_config({"remediation": {"mode": "act", "role": "head"}, "daemon": {"token_file": "/etc/dgxdoctor/token"}})
    parse_config({"remediation": {"mode": "act", "role": "head"}, "daemon": {"alert_token_file": "/etc/a"}})


def test_act_mode_without_a_token_exits_78_at_start(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[remediation]\nmode = "act"\nrole = "head"\n')
    done = run_cli("run", "--config", str(config), "--listen", "127.0.0.1:0", timeout=60)
    assert done.returncode == 78 and "remediation.mode" in done.stderr and "alert_token_file" in done.stderr


async def test_act_mode_without_a_token_is_rejected_on_reload(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'node = "dgx-a"\n[paths]\nstate_dir = "{tmp_path}"\n')
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    path.write_text(path.read_text() + '[remediation]\nmode = "act"\nrole = "head"\n')
    problems = await daemon.reload()
    assert any(p.startswith("remediation.mode") and "alert_token_file" in p for p in problems)
    assert daemon.config.remediation.mode == "observe" and daemon.remediator.settings.mode == "observe"


def test_peers_are_bounded() -> None:
    peers = [f"http://10.{i // 250}.{i % 250}.1:9835" for i in range(10_000)]
    with pytest.raises(ConfigError) as caught:
        parse_config({"daemon": {"peers": peers}})
    assert caught.value.problems == [("daemon", "Expected `array` of length <= 64 - at `$.daemon.peers`")]


# -- the state file --------------------------------------------------------------------------------------

BAD_STATES = [
    '{"in_flight": {"bogus": 1}}',
    '{"breaker": "open"}',
    '{"breaker": {"open": "yes"}}',
    '{"actions": [{"action": "rm -rf /", "at": 1}]}',
    '{"onset": {"check:vllm:restart_vllm": "soon"}}',
    '{"version": 2}',
    '{"last": {"restart_vllm": NaN}}',
    "[]",
    "{",
]


@pytest.mark.parametrize("doc", BAD_STATES)
def test_a_state_of_the_wrong_shape_is_refused_naming_where(tmp_path: Path, doc: str) -> None:
    (tmp_path / "remediation-state.json").write_text(doc)
    with pytest.raises(ValueError):
        GuardState.from_doc(guard_state_file(tmp_path).read())


def test_state_errors_name_the_key() -> None:
    with pytest.raises(StateDocError, match=r"unknown field `bogus` - at `\$\.in_flight`"):
        GuardState.from_doc({"in_flight": {"bogus": 1}})
    with pytest.raises(StateDocError, match="breaker"):
        GuardState.from_doc({"breaker": "open"})


@pytest.mark.parametrize("doc", BAD_STATES)
async def test_a_bad_state_file_is_set_aside_and_the_breaker_opened(tmp_path: Path, doc: str) -> None:
    (tmp_path / "remediation-state.json").write_text(doc)
    marker = tmp_path / "restarted"
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD}, commands={"restart_vllm": ["touch", str(marker)]})
    r.recover()  # what start() does: never a crash
    kept = list(tmp_path.glob("remediation-state.json.invalid-*"))
    assert len(kept) == 1 and kept[0].read_text() == doc  # kept for the operator, as it was
    state = guard_state_file(tmp_path).read()
    assert state["breaker"]["open"] is True and "invalid" in state["breaker"]["reason"]
    metrics = r.metrics()
    assert metrics["mode"] == "disabled" and metrics["breaker_open"] and metrics["state_invalid"] == 1
    await settle(r)
    assert not marker.exists()  # nothing runs until an operator resets
    assert any(e["event"] == "state_invalid" for e in events(tmp_path))


async def test_reset_recovers_from_a_bad_state_file(tmp_path: Path) -> None:
    (tmp_path / "remediation-state.json").write_text('{"breaker": "open"}')
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'node = "dgx-a"\n[paths]\nstate_dir = "{tmp_path}"\n')
    done = run_cli("remediation", "reset", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert guard_state_file(tmp_path).read()["breaker"]["open"] is False
    assert len(list(tmp_path.glob("remediation-state.json.invalid-*"))) == 1
    # The daemon's side: set aside, breaker open; the reset closes it and the next fault is acted on.
    marker = tmp_path / "restarted"
    (tmp_path / "remediation-state.json").write_text('{"in_flight": {"bogus": 1}}')
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD}, commands={"restart_vllm": ["touch", str(marker)]})
    await settle(r)
    assert not marker.exists() and r.metrics()["mode"] == "disabled"
    assert run_cli("remediation", "reset", "--config", str(cfg)).returncode == 0
    await settle(r)
    assert marker.exists() and r.metrics()["mode"] == "act"


def test_a_huge_state_file_is_invalid_not_read_whole(tmp_path: Path) -> None:
    (tmp_path / "remediation-state.json").write_text('{"onset": {' + " " * (2 << 20) + "}}")
    with pytest.raises(ValueError, match="larger than"):
        guard_state_file(tmp_path).read()


# -- the disk --------------------------------------------------------------------------------------------


async def test_a_failed_audit_write_leaves_nothing_in_flight(tmp_path: Path) -> None:
    """The audit is written before the state says "in flight": a disk that refuses the audit starts nothing and
    wedges nothing; once it accepts again, the next evaluation acts."""
    marker = tmp_path / "restarted"
    (tmp_path / "remediation.jsonl").mkdir()  # every append fails (EISDIR), the state file still works
    before = WRITE_ERRORS["remediation.jsonl"]
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD}, commands={"restart_vllm": ["touch", str(marker)]})
    await settle(r)
    await settle(r)
    assert not marker.exists() and guard_state_file(tmp_path).read().get("in_flight") is None
    assert WRITE_ERRORS["remediation.jsonl"] >= before + 2  # counted every time: dgxdoctor_write_errors_total
    (tmp_path / "remediation.jsonl").rmdir()
    await settle(r)
    assert marker.exists() and guard_state_file(tmp_path).read()["in_flight"] is None
    assert [e["event"] for e in events(tmp_path)][-2:] == ["action_started", "action"]


async def test_an_action_end_the_disk_refused_is_saved_later(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD})
    await settle(r)
    r.state_file.write({**guard_state_file(tmp_path).read(), "in_flight": {"id": "abc", "action": "restart_vllm",
                        "key": "check:vllm:restart_vllm", "started_at": 1.0, "pid": 1}})  # fmt: skip
    r.pending_finish = ("abc", time.time())
    await r.evaluate()
    assert guard_state_file(tmp_path).read()["in_flight"] is None and r.pending_finish is None


# -- the webhook -----------------------------------------------------------------------------------------


def alert(fingerprint: str, started: float, status: str = "firing", **labels: str) -> IncomingAlert:
    return IncomingAlert(status, {**VLLM_DOWN, **labels}, fingerprint, f"t{started}", started)


async def test_the_firing_map_and_the_state_file_stay_bounded(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([]), {}, mode="observe")
    now = time.time()
    r.accept_alerts([alert(f"f{i}", now - 1, alertname=f"Name{i}") for i in range(1000)])
    r.accept_alerts([alert(f"g{i}", now - 1) for i in range(1000)])
    assert len(r.firing) <= intake.MAX_FIRING
    assert len({p.key for p in r.firing.values()}) <= intake.MAX_ALERT_PROBLEMS
    assert r.metrics()["alerts_dropped"] > 0
    for _ in range(28):
        r.accept_alerts([alert(f"h{i}-{_}", now, alertname=f"Other{_}{i}") for i in range(1000)])
    await settle(r)
    assert (tmp_path / "remediation-state.json").stat().st_size < 32 * 1024


async def test_a_late_firing_after_its_resolved_alert_is_not_acted_on(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([]), {})
    started = time.time() - 5
    assert r.accept_alerts([alert("f1", started, status="resolved")]) == (0, 1)
    assert r.accept_alerts([alert("f1", started)]) == (0, 1)
    await settle(r)
    assert events(tmp_path) == []


async def test_a_replay_after_a_thousand_other_fingerprints_is_not_acted_on(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([]), {})
    started = time.time() - 5
    assert r.accept_alerts([alert("f1", started)]) == (1, 0)
    await settle(r)
    assert [e["event"] for e in events(tmp_path)].count("action") == 1
    r.accept_alerts([alert(f"other{i}", started - 100, instance=str(i)) for i in range(1000)])
    assert r.accept_alerts([alert("f1", started)]) == (0, 1)
    await settle(r)
    assert [e["event"] for e in events(tmp_path)].count("action") == 1


def back() -> CheckResult:
    """vLLM dead again, seen after the last action ended: the ladder's next rung."""
    return CheckResult("vllm", Status.CRITICAL, "dead", DEAD.findings, started_at=time.time() + 1)


async def test_the_ladder_does_not_page_before_the_cluster_restart_ends(tmp_path: Path) -> None:
    """A page says "restarts did not cure it": never while the cluster restart still runs."""
    gate = tmp_path / "gate"
    held = tmp_path / "held.sh"  # the restart's first step runs until the test opens the gate
    held.write_text(f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\n')
    held.chmod(0o755)
    results: dict[str, CheckResult] = {"vllm": DEAD}
    r = remediator(tmp_path, vllm_app([]), results, budget=10,
                   commands={"stop_vllm": [str(held)], "ray_stop": ["true"], "ray_start": ["true"]})  # fmt: skip
    r.targets = r.targets.__class__(r.targets.vllm, "http://ray:8265", 0, 0, (), r.targets.token)
    try:
        await settle(r)  # restart_vllm, done
        results["vllm"] = back()
        await r.evaluate()  # back: restart_cluster starts (its first step holds until the gate opens)
        for _ in range(10):
            results["vllm"] = back()
            await r.evaluate()
        pages = [e for e in events(tmp_path) if e.get("verdict") == "page" or e["event"] == "page"]
        assert pages == [] and guard_state_file(tmp_path).read()["in_flight"]["action"] == "restart_cluster"
    finally:
        gate.touch()
        await r.stop()  # what the daemon does at its stop: the restart ends here, not after Ray's 300 s


async def test_a_stop_ends_a_running_cluster_restart_at_its_next_poll(tmp_path: Path) -> None:
    """The action's thread used to outlive ``stop``: it polled Ray for ``ray_ready_timeout_s`` (300 s), the event
    loop's close waited on it (the next test hung), and the audit never said how the action ended."""
    seen: list[str] = []
    results: dict[str, CheckResult] = {"vllm": DEAD}
    r = remediator(tmp_path, vllm_app(seen), results, budget=10,
                   commands={"stop_vllm": ["true"], "ray_stop": ["true"], "ray_start": ["true"]})  # fmt: skip
    await settle(r)  # restart_vllm, done
    results["vllm"] = back()
    await r.evaluate()  # restart_cluster: Ray never shows its 2 nodes and 16 GPUs (the dashboard answers 404)
    while "GET /api/v0/nodes" not in seen:  # the restart is waiting for Ray
        await asyncio.sleep(0.01)
    await asyncio.wait_for(r.stop(), STOP_WAIT_S)
    last = events(tmp_path)[-1]
    assert (last["event"], last["action"], last["outcome"]) == ("action", "restart_cluster", "interrupted")
    assert [s["step"] for s in last["steps"]] == [
        "stop:stop_vllm",
        "stop:stop_ray_head",
        "start_ray_head",
        "interrupted",
    ]
    assert guard_state_file(tmp_path).read()["in_flight"] is None
    assert r.metrics()["actions"][("restart_cluster", "interrupted")] == 1
    assert r.acting is not None and r.acting.done()  # its thread is free: nothing left to hold up an exit


# -- the worker's steps ----------------------------------------------------------------------------------


def worker(tmp_path: Path, marker: Path, **kw: Any) -> Any:
    return remediator(tmp_path, vllm_app([]), {}, role="worker", commands={"ray_stop": ["touch", str(marker)]}, **kw)


async def test_a_step_honours_the_workers_own_breaker(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    guard_state_file(tmp_path).write({"breaker": {"open": True, "reason": "budget spent", "opened_at": time.time()}})
    status, answer = await worker(tmp_path, marker).run_step(step_request("ray_stop", "0123456789ab"))
    assert status == 409 and "breaker open" in answer["detail"] and not marker.exists()


async def test_a_step_spends_the_workers_own_budget(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    w = worker(tmp_path, marker, budget=1)
    assert (await w.run_step(step_request("ray_stop", "aaaaaaaaaaaa")))[0] == 200
    marker.unlink()
    status, answer = await w.run_step(step_request("ray_stop", "bbbbbbbbbbbb"))
    assert status == 409 and "breaker opened" in answer["detail"] and not marker.exists()


async def test_a_replayed_or_stale_or_unsigned_step_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    w = worker(tmp_path, marker, budget=10)
    request = step_request("ray_stop", "cccccccccccc")
    assert (await w.run_step(request))[0] == 200
    marker.unlink()
    assert (await w.run_step(request))[0] == 409  # the same request again
    assert (await w.run_step(step_request("ray_stop", "dddddddddddd", sent_at=time.time() - 600)))[0] == 409
    forged = {**step_request("ray_stop", "eeeeeeeeeeee"), "mac": "0" * 64}
    assert (await w.run_step(forged))[0] == 401
    other_token = step_request("ray_stop", "ffffffffffff", token="x" * 16)
    assert (await w.run_step(other_token))[0] == 401
    assert (await w.run_step({"step": "ray_stop", "id": "0123456789ab"}))[0] == 400  # unsigned, the old shape
    assert not marker.exists()
    replays = [e for e in events(tmp_path) if e["event"] == "step" and e["outcome"] == "refused"]
    assert any("replay" in e["detail"] for e in replays)


# -- what an operator's terminal shows -------------------------------------------------------------------


def test_status_survives_a_lone_surrogate_and_escapes_nothing_to_the_terminal(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'node = "dgx-a"\n[paths]\nstate_dir = "{tmp_path}"\n')
    AuditLog(tmp_path).append({"ts": time.time(), "event": "action", "action": "restart_vllm", "outcome": "failed",
                               "problem": "alert:\ud800\x1b]0;owned\x07\x1b[2J:restart_vllm"})  # fmt: skip
    done = run_cli("remediation", "status", "--config", str(cfg))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\\x1b]0;owned" in done.stdout
    assert run_cli("remediation", "status", "--json", "--config", str(cfg)).returncode == 0
    doc = status_document(load_config(cfg))
    render_status(doc).encode("utf-8")  # nothing a terminal cannot print


def test_an_alert_name_reaches_the_state_printable_and_bounded() -> None:
    from dgxdoctor.remediation.policy import problem_from_alert

    problem = problem_from_alert({**VLLM_DOWN, "alertname": "\x1b[2J" + "x" * 1000}, "dgx-a", 1.0)
    assert problem is not None and "\x1b" not in problem.key and len(problem.key) < 200
    json.dumps(problem.key).encode("utf-8")

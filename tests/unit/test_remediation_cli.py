"""``dgxdoctor remediation status [--json]`` and ``reset`` against a state dir, the daemon not running."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from dgxdoctor.remediation.audit import AuditLog, guard_state_file


def config(tmp_path: Path, extra: str = "", token: bool = False) -> str:
    path = tmp_path / "config.toml"
    daemon = '[daemon]\ntoken = "remediation-cli-token-0123"\n' if token else ""
    path.write_text(f'node = "dgx-a"\n{daemon}[paths]\nstate_dir = "{tmp_path}"\n[remediation]\nbudget = 2\n{extra}')
    return str(path)


def test_status_of_a_fresh_node(tmp_path: Path) -> None:
    done = run_cli("remediation", "status", "--json", "--config", config(tmp_path))
    assert done.returncode == 0, done.stderr
    doc = done.json()
    assert doc["mode"] == "observe" and doc["breaker"]["open"] is False and doc["budget"]["left"] == 2
    assert doc["last_actions"] == []


def test_status_shows_the_breaker_and_reset_closes_it(tmp_path: Path) -> None:
    import time

    now = time.time()
    guard_state_file(tmp_path).write(
        {"breaker": {"open": True, "reason": "budget of 2 actions per 3600 s spent", "opened_at": now},
         "actions": [{"action": "restart_vllm", "at": now - 10}, {"action": "restart_cluster", "at": now - 5}]}
    )  # fmt: skip
    AuditLog(tmp_path).append({"ts": now - 5, "event": "action", "action": "restart_cluster", "outcome": "failed",
                               "duration_s": 42.5, "problem": "check:ray:restart_cluster"})  # fmt: skip
    cfg = config(tmp_path, 'mode = "act"\nrole = "head"\n', token=True)
    text = run_cli("remediation", "status", "--config", cfg)
    assert text.returncode == 0, text.stderr
    assert "breaker: OPEN (budget of 2" in text.stdout and "restart_cluster failed in 42.5 s" in text.stdout
    assert "budget: 0 of 2" in text.stdout
    done = run_cli("remediation", "reset", "--config", cfg)
    assert done.returncode == 0 and "breaker closed" in done.stdout
    doc = run_cli("remediation", "status", "--json", "--config", cfg).json()
    assert doc["breaker"]["open"] is False and doc["budget"]["left"] == 2
    assert AuditLog(tmp_path).tail(1)[0]["event"] == "reset"


def test_act_mode_without_a_role_is_a_config_error(tmp_path: Path) -> None:
    done = run_cli("remediation", "status", "--config", config(tmp_path, 'mode = "act"\n'))
    assert done.returncode == 78 and "remediation" in done.stderr and "role" in done.stderr


def test_a_corrupt_state_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "remediation-state.json").write_text("{")
    done = run_cli("remediation", "status", "--config", config(tmp_path))
    assert done.returncode == 1 and "cannot read the remediation state" in done.stderr


async def test_observe_mode_status_shows_the_would_restart_decisions(tmp_path: Path) -> None:
    """Observe mode runs nothing; `remediation status` shows what it would have done (it showed nothing), and the
    role from [node] role without a [remediation] table (it showed "-")."""
    from test_remediation_engine import DEAD, remediator, vllm_app

    state = tmp_path / "state"
    r = remediator(state, vllm_app([]), {"vllm": DEAD}, mode="observe")
    await r.evaluate()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[node]\nname = "dgx-a"\nrole = "head"\n[paths]\nstate_dir = "{state}"\n')
    doc = run_cli("remediation", "status", "--json", "--config", str(cfg)).json()
    assert doc["last_actions"] == []
    (decision,) = doc["last_decisions"]
    assert decision["verdict"] == "observe" and decision["action"] == "restart_vllm"
    assert doc["role"] == "head" and doc["dry_run"] is True
    text = run_cli("remediation", "status", "--config", str(cfg)).stdout
    assert "node dgx-a: mode observe, role head" in text and "rehearsal: observe mode spent" in text
    assert 'observe restart_vllm for check:vllm:restart_vllm: would restart_vllm (mode = "observe"): VLLM_DEAD' in text


def test_status_lists_an_alert_held_on_old_evidence_not_a_passing_hold(tmp_path: Path) -> None:
    """An operator sees the alert firing and nothing done: status says why. A hold that passes by itself (hold_s,
    a cooldown) is not listed."""
    import time

    from dgxdoctor.remediation.policy import OLD_EVIDENCE

    audit, now = AuditLog(tmp_path), time.time()
    held = {"event": "decision", "problem": "alert:DgxdoctorNcclFailure:restart_cluster", "source": "alert",
            "action": "restart_cluster", "verdict": "hold", "mode": "act"}  # fmt: skip
    audit.append({**held, "ts": now - 20, "reason": "condition held 3 s of hold_s 30 s"})
    audit.append({**held, "ts": now - 10, "reason": OLD_EVIDENCE})
    doc = run_cli("remediation", "status", "--json", "--config", config(tmp_path)).json()
    assert [(d["verdict"], d["reason"]) for d in doc["last_decisions"]] == [("hold", OLD_EVIDENCE)]
    text = run_cli("remediation", "status", "--config", config(tmp_path)).stdout
    assert "hold restart_cluster for alert:DgxdoctorNcclFailure:restart_cluster: its evidence is from before" in text

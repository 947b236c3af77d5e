"""An actor Ray tears down on request is no dead worker (judge/ray_exit.py): the GCS's SYSTEM_ERROR report of the
worker of an actor it has just destroyed (the driver's job finished) stays silent in `diagnose` and in the daemon's
logs check, a real healthy run's lines (tests/fixtures/corpus/healthy, SOURCES.md); a worker that dies by itself
is still RAY_WORKER_DIED, critical."""

from __future__ import annotations

from pathlib import Path

from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from dgxdoctor.validation import validate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEARDOWN = FIXTURES / "corpus" / "healthy" / "ray_2.60_gcs_actor_killed_job_finished.txt"
CRASH = FIXTURES / "logs" / "captured" / "ray_2.60.0_actor_died_session.txt"


def _codes(text: str) -> dict[str, Status]:
    return {f.code: f.status for d in diagnose(text) for f in d.findings}


def _daemon(tmp_path: Path, text: str) -> dict[str, Status]:
    log = tmp_path / "gcs_server.out"
    log.write_text(text)
    raw = {"vllm_paths": [], "ray_paths": [str(log)], "journal_units": [], "from_start": True}
    check = LogsCheck(validate(LogsSettings, raw), Environment(state_dir=tmp_path / "state", one_shot=False))
    return {f.code: f.status for f in check.run().findings}


def test_diagnose_and_the_daemon_read_an_actor_torn_down_with_its_job_as_healthy(tmp_path: Path) -> None:
    text = TEARDOWN.read_text()
    assert "exit_type = SYSTEM_ERROR" in text and "Destroying actor, force_kill=1" in text
    assert _codes(text) == {}
    assert "RAY_WORKER_DIED" not in _daemon(tmp_path, text)


def test_diagnose_and_the_daemon_still_name_a_worker_that_died_by_itself(tmp_path: Path) -> None:
    # The same lines without the GCS destroying the actor first: the worker's exit is its own.
    text = "".join(line for line in TEARDOWN.read_text().splitlines(keepends=True) if "Destroying actor" not in line)
    assert _codes(text).get("RAY_WORKER_DIED") is Status.CRITICAL
    assert _daemon(tmp_path, text).get("RAY_WORKER_DIED") is Status.CRITICAL
    assert _codes(CRASH.read_text()).get("RAY_WORKER_DIED") is Status.CRITICAL


RAYLET_STOP = FIXTURES / "corpus" / "healthy" / "ray_2.60_raylet_sigterm_stop.txt"


def test_a_raylet_stopped_by_sigterm_reads_as_healthy_its_agent_error_is_the_stops_echo() -> None:
    # `ray stop` / `systemctl stop`: the raylet logs its graceful shutdown, then at ERROR that one agent "failed"
    # (the dashboard agent, exit code 0, stopped with it): no UNCATALOGUED_ERROR.
    text = RAYLET_STOP.read_text()
    assert "received SIGTERM" in text and "The raylet exited immediately because one Ray agent failed" in text
    assert _codes(text) == {}


def test_the_same_agent_error_without_a_requested_stop_still_surfaces() -> None:
    lines = RAYLET_STOP.read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if "SIGTERM" not in line and "graceful shutdown" not in line)
    assert _codes(text) == {"UNCATALOGUED_ERROR": Status.WARNING}

"""The logs check finds every catalog signature in real log excerpts appended to followed files (the daemon,
`one_shot=False`), and the one-shot `check` reads the recent past of each file and says what it did not read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from dgxdoctor.validation import validate

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
CODES = sorted(p.stem.upper() for p in LOGS.glob("*.log") if p.stem != "lookalikes")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, clock: Clock, **settings: object) -> tuple[LogsCheck, Path, Path]:
    vllm_log = tmp_path / "logs" / "vllm.log"
    ray_dir = tmp_path / "ray"
    vllm_log.parent.mkdir()
    ray_dir.mkdir()
    vllm_log.write_text("INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds\n")
    defaults: dict[str, object] = {
        "vllm_paths": [str(vllm_log)],
        "ray_paths": [str(ray_dir / "*.err"), str(ray_dir / "*.out")],
        "journal_units": [],  # these tests are of files; the journal's are test_logs_journal.py
    }
    env = Environment(state_dir=tmp_path / "state", clock=clock, one_shot=False)
    check = LogsCheck(validate(LogsSettings, {**defaults, **settings}), env)
    return check, vllm_log, ray_dir


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


@pytest.mark.parametrize("code", CODES)
def test_finds_each_signature_in_real_excerpt(tmp_path: Path, code: str) -> None:
    clock = Clock()
    check, vllm_log, _ = make(tmp_path, clock)
    assert check.run().status is Status.OK  # first sight: history is not reported
    append(vllm_log, (LOGS / f"{code.lower()}.log").read_text())
    result = check.run()
    codes = {f.code for f in result.findings} - {"LOGS_UNCATALOGUED_ERRORS"}  # what else the excerpt says, shown
    assert codes == {code}
    finding = result.findings[0]
    assert finding.subject == str(vllm_log)
    assert finding.evidence and finding.remedy
    assert result.status is finding.status
    assert result.action is not None and result.action.remedy == finding.remedy


def test_ray_logs_and_window_expiry(tmp_path: Path) -> None:
    clock = Clock()
    check, _, ray_dir = make(tmp_path, clock, hold_s=900.0)
    worker = ray_dir / "worker-abc.err"
    worker.write_text("")
    check.run()
    append(worker, (LOGS / "ray_worker_died.log").read_text())
    result = check.run()
    assert [f.code for f in result.findings] == ["RAY_WORKER_DIED"]
    assert "(4 lines)" in result.findings[0].message
    counter = {s.labels["code"]: s.value for s in result.samples if s.metric.name.endswith("_matches_total")}
    assert counter == {"RAY_WORKER_DIED": 4.0}
    clock.now += 600
    assert check.run().status is Status.CRITICAL  # still inside the window
    clock.now += 400
    result = check.run()
    assert result.status is Status.OK and result.findings == ()


def test_lookalikes_give_ok(tmp_path: Path) -> None:
    check, vllm_log, _ = make(tmp_path, Clock())
    check.run()
    append(vllm_log, (LOGS / "lookalikes.log").read_text())
    result = check.run()
    # Look-alikes of signatures; the plain errors among them are shown as uncatalogued, at OK, never acted on.
    assert result.status is Status.OK
    assert {f.code for f in result.findings} <= {"LOGS_UNCATALOGUED_ERRORS"}


def test_restart_does_not_report_history_again(tmp_path: Path) -> None:
    clock = Clock()
    check, vllm_log, _ = make(tmp_path, clock)
    check.run()
    append(vllm_log, (LOGS / "cuda_oom.log").read_text())
    assert check.run().status is Status.CRITICAL
    again = LogsCheck(check.settings, Environment(state_dir=tmp_path / "state", clock=clock, one_shot=False))
    result = again.run()  # offsets came back from the state file: the lines are not read twice ...
    assert [f.code for f in result.findings] == ["CUDA_OOM"]  # ... and the match is still inside its window
    assert "(3 lines)" in result.findings[0].message
    clock.now += 1000
    assert (
        LogsCheck(check.settings, Environment(state_dir=tmp_path / "state", clock=clock, one_shot=False)).run().findings
        == ()
    )


def test_nothing_configured_or_present_is_skipped(tmp_path: Path) -> None:
    env = Environment(state_dir=tmp_path / "state")
    settings = LogsSettings(vllm_paths=[], ray_paths=[str(tmp_path / "nope" / "*.log")], journal_units=[])
    result = LogsCheck(settings, env).run()
    assert result.status is Status.SKIPPED


def test_unwritable_state_dir_still_reports(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = tmp_path / "vllm.log"
    log.write_text("")
    env = Environment(state_dir=blocker / "state")  # a file where a directory should be
    check = LogsCheck(LogsSettings(vllm_paths=[str(log)], ray_paths=[]), env)
    check.run()
    append(log, "RuntimeError: CUDA error: out of memory\n")
    assert [f.code for f in check.run().findings] == ["CUDA_OOM"]


def test_logs_appearing_after_a_skipped_run_are_read_whole(tmp_path: Path) -> None:
    ray_dir = tmp_path / "ray"
    env = Environment(state_dir=tmp_path / "state", clock=Clock(), one_shot=False)
    check = LogsCheck(LogsSettings(vllm_paths=[], ray_paths=[str(ray_dir / "*.out")], journal_units=[]), env)
    assert check.run().status is Status.SKIPPED  # Ray not started yet
    ray_dir.mkdir()
    session = (LOGS / "captured" / "ray_2.60.0_actor_died_session.txt").read_text()
    (ray_dir / "gcs_server.out").write_text(session)
    result = check.run()
    assert [f.code for f in result.findings] == ["RAY_WORKER_DIED"]
    assert "(2 lines)" in result.findings[0].message


def test_corrupt_state_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "logs_offsets.json").write_text(
        '{"positions": {"/x": "nope"}, "recent": [{"code": "NOT_A_CODE", "path": "/x", "line": "l", '
        '"last_seen": 1, "count": 1}, {"code": "CUDA_OOM", "path": 3}, "junk"]}'
    )
    log = tmp_path / "vllm.log"
    log.write_text("RuntimeError: CUDA error: out of memory\n")  # history: first sight starts at the end
    check = LogsCheck(
        LogsSettings(vllm_paths=[str(log)], ray_paths=[]), Environment(state_dir=state, clock=Clock(), one_shot=False)
    )
    assert check.run().findings == ()


def test_a_clean_vllm_stop_is_no_finding_and_an_oom_reads_its_phase(tmp_path: Path) -> None:
    """The live check reads a match with the lines before it, as diagnose does (judge.context)."""
    check, vllm_log, _ = make(tmp_path, Clock())
    check.run()
    healthy = Path(__file__).resolve().parents[1] / "fixtures" / "corpus" / "healthy"
    append(vllm_log, (healthy / "captured_vllm_0.32_cpu_start_serve_stop.txt").read_text())
    assert check.run().findings == ()
    append(vllm_log, 'INFO:     127.0.0.1:52996 - "POST /v1/completions HTTP/1.1" 200 OK\n')
    append(vllm_log, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n")
    assert [f.code for f in check.run().findings] == ["CUDA_OOM_SERVING"]


def one_shot(tmp_path: Path, log: Path, **settings: object) -> LogsCheck:
    env = Environment(state_dir=tmp_path / "state", clock=Clock())  # one_shot=True: `dgxdoctor check`
    return LogsCheck(LogsSettings(vllm_paths=[str(log)], ray_paths=[], **settings), env)  # type: ignore[arg-type]


def test_one_shot_check_reads_the_recent_past_of_a_log_full_of_errors(tmp_path: Path) -> None:
    """The new operator's case: `dgxdoctor check` on a log holding an NCCL timeout and EngineDeadError."""
    log = tmp_path / "vllm.log"
    log.write_text((LOGS / "nccl_timeout.log").read_text() + "vllm.v1.engine.exceptions.EngineDeadError: x\n")
    result = one_shot(tmp_path, log).run()
    assert {"NCCL_TIMEOUT", "VLLM_ENGINE_DEAD"} <= {f.code for f in result.findings}
    assert result.status is Status.CRITICAL
    assert "read the last" in result.summary and "1 log file(s)" in result.summary
    again = one_shot(tmp_path, log).run()  # read-only: the next one-shot run sees the same
    assert {f.code for f in again.findings} == {f.code for f in result.findings}


def test_one_shot_check_says_what_it_did_not_read(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    old = "RuntimeError: CUDA error: out of memory\n" + "INFO 05-16 18:43:01 [loader.py:447] ok\n" * 5000
    log.write_text(old + "INFO 05-16 18:43:02 [loader.py:447] recent\n")
    result = one_shot(tmp_path, log, check_window_bytes=4096).run()
    assert result.findings == ()  # the OOM lies before the window
    assert "before the last 0.0 MiB per file not read" in result.summary
    os.utime(log, (time.time() - 3600, time.time() - 3600))
    stale = one_shot(tmp_path, log).run()
    assert "1 file(s) not written in the last 900 s not read" in stale.summary


def test_one_shot_backlog_over_the_per_run_limit_is_not_ok(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds\n" * 2000)
    result = one_shot(tmp_path, log, max_bytes_per_run=4096).run()
    backlog = [f for f in result.findings if f.code == "LOG_BACKLOG"]
    assert backlog and backlog[0].status is Status.WARNING and result.status is Status.WARNING
    assert f"{log.stat().st_size - 4096} bytes" in backlog[0].message


def test_daemon_backlog_is_a_warning_naming_the_unread_bytes(tmp_path: Path) -> None:
    check, vllm_log, _ = make(tmp_path, Clock(), max_bytes_per_run=4096)
    check.run()
    append(vllm_log, "INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds\n" * 2000)
    result = check.run()
    backlog = [f for f in result.findings if f.code == "LOG_BACKLOG"]
    assert backlog and backlog[0].status is Status.WARNING and "bytes are not read yet" in backlog[0].message


@pytest.mark.parametrize("one_shot", [False, True])
def test_no_log_files_compiles_no_catalog(tmp_path: Path, one_shot: bool) -> None:
    """The daemon (and `check`) on a node without vLLM or Ray logs never holds the catalog's patterns and RE2's
    prefilter; they are compiled when the first file appears."""
    settings = LogsSettings(
        vllm_paths=[str(tmp_path / "vllm*.log")], ray_paths=[str(tmp_path / "ray*.log")], journal_units=[]
    )
    check = LogsCheck(settings, Environment(state_dir=tmp_path / "state", one_shot=one_shot))
    assert check.run().status is Status.SKIPPED
    assert check._catalog is None
    if not one_shot:
        (tmp_path / "vllm1.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        check.run()
        assert check._catalog is not None


def test_an_uncatalogued_failure_is_counted_by_source_and_shown_never_acted_on(tmp_path: Path) -> None:
    """What no signature names but is plainly a failure (judge/uncatalogued.py): a counter per source and an OK
    finding with the latest lines, which no alert or action reads."""
    check, vllm_log, _ = make(tmp_path, Clock())
    check.run()
    line = "(APIServer pid=7) ERROR 12-05 08:00:01 [serving_chat.py:210] Error in preprocessing prompt inputs"
    # (a device-side assert was the example here until the catalog grew to the CUDA runtime's errors)
    odd = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    append(vllm_log, f"{line}\n{line}\n{odd}\n")
    result = check.run()
    (finding,) = [f for f in result.findings if f.code == "LOGS_UNCATALOGUED_ERRORS"]
    assert finding.status is Status.OK and finding.action == "none" and finding.subject == str(vllm_log)
    assert "3 line(s)" in finding.message and "same device" in (finding.evidence or "")
    (sample,) = [s for s in result.samples if s.metric.name == "dgxdoctor_logs_uncatalogued_errors_total"]
    assert sample.value == 3 and sample.labels == {"source": str(vllm_log)}
    assert result.status is Status.OK

"""The logs check follows the systemd journal of vLLM's and Ray's units, as the shipped units log (no
``StandardOutput=``): lines written through a real journal (``systemd-journal-remote``'s files, read by the real
``journalctl --directory``) are matched by the same scanner as files, each once; journalctl missing or failing is
UNKNOWN with the reason; the bundle holds the units' journal, redacted."""

from __future__ import annotations

import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from msgspec.structs import replace

from conftest import run_cli
from dgxdoctor.bundle.build import build_bundle
from dgxdoctor.bundle.items import Sources
from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.config import parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult
from dgxdoctor.validation import validate
from journalwriter import journal_remote, write_journal

# vLLM 0.32's API server when its engine core died (tests/fixtures/corpus/failures/vllm_engine_dead.txt).
ENGINE_DEAD = (
    "ERROR 12-05 09:02:11 [async_llm.py:399] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
    "issue. See stack trace (above) for the root cause."
)
# torch's NCCL watchdog in a worker (tests/fixtures/logs/nccl_timeout.log).
NCCL_TIMEOUT = (
    "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, "
    "Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
)
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
CODES = sorted(p.stem.upper() for p in LOGS.glob("*.log") if p.stem != "lookalikes")
HEALTHY = "INFO 12-05 09:02:10 [loader.py:447] Loading weights took 2.60 seconds"


@pytest.fixture(autouse=True)
def _tool() -> None:
    journal_remote()


def daemon_check(tmp_path: Path, journal: Path, **settings: object) -> LogsCheck:
    raw: dict[str, object] = {
        "vllm_paths": [],
        "ray_paths": [],
        "journal_units": ["vllm.service", "ray-head.service"],
        "journal_directory": str(journal),
        **settings,
    }
    env = Environment(state_dir=tmp_path / "state", one_shot=False)
    return LogsCheck(validate(LogsSettings, raw), env)


def totals(result: CheckResult) -> dict[str, float]:
    return {s.labels["code"]: s.value for s in result.samples if s.metric.name.endswith("_matches_total")}


def test_a_journal_line_is_matched_once_and_a_new_one_once(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    write_journal(journal, [("vllm.service", HEALTHY), ("vllm.service", ENGINE_DEAD)])
    check = daemon_check(tmp_path, journal)
    first = check.run()  # the first read starts at the window: the line written before the agent is read
    assert first.status is Status.CRITICAL, first
    assert [(f.code, f.subject) for f in first.findings] == [("VLLM_ENGINE_DEAD", "journal:vllm.service")]
    assert "EngineDeadError" in (first.findings[0].evidence or "")
    assert totals(first) == {"VLLM_ENGINE_DEAD": 1.0}

    again = check.run()  # the cursor: nothing new, nothing counted again
    assert totals(again) == {"VLLM_ENGINE_DEAD": 1.0}
    assert again.findings[0].message == first.findings[0].message  # still one line held

    write_journal(journal, [("ray-head.service", NCCL_TIMEOUT), ("other.service", NCCL_TIMEOUT)])
    third = check.run()
    assert totals(third) == {"VLLM_ENGINE_DEAD": 1.0, "NCCL_TIMEOUT": 1.0}  # the other unit is not followed
    assert ("NCCL_TIMEOUT", "journal:ray-head.service") in {(f.code, f.subject) for f in third.findings}
    assert totals(check.run()) == {"VLLM_ENGINE_DEAD": 1.0, "NCCL_TIMEOUT": 1.0}


def test_a_restarted_agent_goes_on_from_the_saved_cursor(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    write_journal(journal, [("vllm.service", ENGINE_DEAD)])
    assert totals(daemon_check(tmp_path, journal).run()) == {"VLLM_ENGINE_DEAD": 1.0}
    restarted = daemon_check(tmp_path, journal).run()
    assert totals(restarted) == {}  # the line is not counted again ...
    assert [f.code for f in restarted.findings] == ["VLLM_ENGINE_DEAD"]  # ... and its match is still held
    assert "lines)" not in restarted.findings[0].message
    write_journal(journal, [("vllm.service", ENGINE_DEAD)])
    assert totals(daemon_check(tmp_path, journal).run()) == {"VLLM_ENGINE_DEAD": 1.0}


@pytest.mark.parametrize("code", CODES)
def test_each_signature_excerpt_through_the_journal(tmp_path: Path, code: str) -> None:
    """The real excerpts the file tests use (start-up OOM, TP heads, KV cache, ...), one journal entry per line as
    journald stores a service's stdout: the same codes as from a file."""
    journal = tmp_path / "journal"
    lines = (LOGS / f"{code.lower()}.log").read_text().splitlines()
    write_journal(journal, [("vllm.service", line) for line in lines])
    result = daemon_check(tmp_path, journal).run()
    found = {(f.code, f.subject) for f in result.findings if f.code != "LOGS_UNCATALOGUED_ERRORS"}  # shown, at OK
    assert found == {(code, "journal:vllm.service")}


def test_units_with_no_entries_are_ok(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    write_journal(journal, [("other.service", ENGINE_DEAD)])
    result = daemon_check(tmp_path, journal).run()
    assert result.status is Status.OK, result
    assert "the journal of 2 unit(s)" in result.summary


def test_more_than_a_run_reads_is_a_backlog_read_on_later_runs(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    write_journal(journal, [("vllm.service", HEALTHY)] * 3 + [("vllm.service", ENGINE_DEAD)])
    check = daemon_check(tmp_path, journal, journal_max_lines=2)
    first = check.run()
    assert [f.code for f in first.findings] == ["LOG_BACKLOG"] and first.status is Status.WARNING
    second = check.run()
    assert {f.code for f in second.findings} == {"VLLM_ENGINE_DEAD"}  # the last two entries: nothing left over
    assert totals(second) == {"VLLM_ENGINE_DEAD": 1.0}
    assert totals(check.run()) == {"VLLM_ENGINE_DEAD": 1.0}


def test_a_journal_that_cannot_be_read_is_unknown_with_the_reason(tmp_path: Path) -> None:
    result = daemon_check(tmp_path, tmp_path / "no-such-journal").run()
    assert result.status is Status.UNKNOWN, result
    (finding,) = result.findings
    assert finding.code == "JOURNAL_UNREADABLE" and finding.status is Status.UNKNOWN
    assert "journalctl exited 1" in finding.message and "no-such-journal" in finding.message


def config_file(tmp_path: Path, journal: Path) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(
        f'node = "dgx-a"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[checks.logs]\nvllm_paths = []\nray_paths = []\njournal_directory = "{journal}"\n'
    )
    return config


def test_one_shot_check_reads_the_shipped_units_journal(tmp_path: Path) -> None:
    """`dgxdoctor check` as an operator runs it, with the default units (those of systemd/)."""
    journal = tmp_path / "journal"
    write_journal(journal, [("vllm-head-mp.service", ENGINE_DEAD)])
    done = run_cli("check", "--config", str(config_file(tmp_path, journal)), "--only", "logs", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    (check,) = done.json()["checks"]
    assert [(f["code"], f["subject"]) for f in check["findings"]] == [
        ("VLLM_ENGINE_DEAD", "journal:vllm-head-mp.service")
    ]
    assert "1 journal entries of the last 900 s" in check["summary"]


def test_missing_journalctl_is_unknown_with_the_reason(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    write_journal(journal, [("vllm.service", ENGINE_DEAD)])
    empty = tmp_path / "bin"
    empty.mkdir()
    config = config_file(tmp_path, journal)
    done = run_cli("check", "--config", str(config), "--only", "logs", "--json", env={"PATH": str(empty)})
    assert done.returncode == 3, done.stdout + done.stderr
    (check,) = done.json()["checks"]
    assert check["status"] == "unknown"
    (finding,) = check["findings"]
    assert finding["code"] == "JOURNAL_UNREADABLE"
    assert "journalctl not found in PATH" in finding["message"]


def no_other_tools(argv: Sequence[str], timeout_s: float = 0) -> CommandResult:
    raise CommandNotFound(f"{argv[0]} not found in PATH")


def test_the_bundle_holds_the_units_journal_redacted(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    token = "s3cr3t-token-value-0123456789"
    write_journal(
        journal,
        [
            ("vllm.service", ENGINE_DEAD),
            ("vllm.service", f"INFO api key in argv: --api-key {token}"),
            ("nvidia-fabricmanager.service", "Fabric Manager started"),
            ("dgxdoctor.service", "check logs critical"),
        ],
    )
    config = parse_config(
        {
            "node": "dgx-a",
            "paths": {"state_dir": str(tmp_path / "state"), "kmsg_path": str(tmp_path / "kmsg")},
            "daemon": {"token": token},
            "checks": {"logs": {"vllm_paths": [], "ray_paths": [], "journal_directory": str(journal)}},
        }
    )
    env = replace(config.environment(), run_command=no_other_tools)  # journalctl runs for real (run_command_head)
    sources = Sources(lambda: {}, lambda: {}, 3600.0, bug_report=False)
    out = tmp_path / "b.tar.gz"
    build_bundle(config, env, sources, out, 30.0, (), "dgxdoctor bundle")
    with tarfile.open(out, "r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    vllm = files["b/dgx-a/logs/journal/vllm.service.log"].decode()
    assert "EngineDeadError" in vllm and "vllm.service[4242]" in vllm
    assert token not in vllm and "<redacted>" in vllm
    assert "Fabric Manager started" in files["b/dgx-a/logs/journal/nvidia-fabricmanager.service.log"].decode()
    assert "check logs critical" in files["b/dgx-a/logs/journal/dgxdoctor.service.log"].decode()
    assert files["b/dgx-a/logs/journal/ray-head.service.log"] == b""  # a unit with no entries: an empty file


def test_the_daemon_counts_a_journal_line_once_on_metrics(tmp_path: Path) -> None:
    """`dgxdoctor run` as installed: an NCCL timeout written through the journal for vllm.service reaches
    /metrics once; a second one adds one; runs in between count nothing again."""
    from daemonproc import DaemonProc
    from dgxdoctor.checks.registry import ALL_CHECKS

    journal = tmp_path / "journal"
    write_journal(journal, [("vllm.service", HEALTHY), ("vllm.service", NCCL_TIMEOUT)])
    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name != "logs")
    body = (
        f'node = "dgx-a"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n[daemon]\nlisten = "@LISTEN@"\n'
        f'[checks.logs]\ninterval_s = 0.5\nvllm_paths = []\nray_paths = []\njournal_directory = "{journal}"\n{quiet}'
    )
    proc = DaemonProc(tmp_path / "daemon", body).start()
    name = "dgxdoctor_logs_signature_matches_total"
    try:
        proc.wait_healthy()
        proc.wait_for(lambda: proc.metric(name, code="NCCL_TIMEOUT") == 1.0, 30, "the first line counted")
        time.sleep(2)  # several runs
        assert proc.metric(name, code="NCCL_TIMEOUT") == 1.0
        write_journal(journal, [("vllm.service", NCCL_TIMEOUT)])
        proc.wait_for(lambda: proc.metric(name, code="NCCL_TIMEOUT") == 2.0, 30, "the second line counted")
        time.sleep(2)
        assert proc.metric(name, code="NCCL_TIMEOUT") == 2.0
        assert proc.metric("dgxdoctor_check_status", check="logs") == 2.0  # critical
    finally:
        proc.kill()

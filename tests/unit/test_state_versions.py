"""State files carry their format's number and are migrated, never dropped (issue 34): each file as the release at
85f803c wrote it (tests/fixtures/state-85f803c, made by that release's own writers: make.py there) is read by this
release's reader, the one the daemon uses, with what it held; the next save writes this release's format, its
``version`` in it. A format newer than this release's is read for the keys it knows; a ``version`` that is no
format number is refused as corrupt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_remediation_engine import remediator

from dgxdoctor.checks import xid_memory
from dgxdoctor.checks.bench import STATE_FILE as BENCH_FILE
from dgxdoctor.checks.bench import BenchCheck, BenchCheckSettings
from dgxdoctor.checks.ib_history import CounterHistory
from dgxdoctor.checks.infiniband import DEFAULT_THRESHOLDS
from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.incidents import IncidentTracker
from dgxdoctor.sources.statefile import StateFile
from dgxdoctor.validation import validate

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "state-85f803c"
BOOT = "8c1a4b7e-5f0d-4e2a-9b3c-7d6e5f4a3b2c"
NOW = 1764900000.0


def previous(tmp_path: Path, name: str) -> Path:
    """The previous release's ``name`` in a state directory of its own."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    shutil.copyfile(PREVIOUS / name, state / name)
    return state


def on_disk(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_the_previous_logs_offsets_are_read_and_saved_numbered(tmp_path: Path) -> None:
    state = previous(tmp_path, "logs_offsets.json")
    log = tmp_path / "vllm.log"  # the followed file, here rather than in /var/log/vllm
    log.write_text("INFO started\n")
    offsets = state / "logs_offsets.json"
    offsets.write_text(offsets.read_text().replace("/var/log/vllm/vllm.log", str(log)))
    assert "version" not in on_disk(offsets)
    settings = validate(LogsSettings, {"vllm_paths": [str(log)], "ray_paths": [], "journal_units": []})
    check = LogsCheck(settings, Environment(state_dir=state, clock=lambda: NOW + 10, one_shot=False))
    result = check.run()
    # The match the previous release held in its window is still held.
    assert [(f.code, f.subject) for f in result.findings] == [("NCCL_TIMEOUT", str(log))], result.findings
    saved = on_disk(state / "logs_offsets.json")
    assert saved["version"] == 1 and saved["recent"][0]["code"] == "NCCL_TIMEOUT"


def test_the_previous_bench_last_run_is_read(tmp_path: Path) -> None:
    state = previous(tmp_path, BENCH_FILE)
    settings = BenchCheckSettings(serving_python="/venv/bin/python")
    check = BenchCheck(settings, Environment(node="n", state_dir=state, clock=lambda: NOW + 10))
    last = check._last_run()
    assert last is not None
    finished, point = last
    assert (finished, point.concurrency, point.output_throughput, point.model) == (NOW, 8, 650.0, "tiny")
    check._save_last(finished, point)
    assert on_disk(state / BENCH_FILE)["version"] == 1


def test_the_previous_xid_memory_is_read(tmp_path: Path) -> None:
    state = previous(tmp_path, xid_memory.STATE_FILE_NAME)
    memory = xid_memory.load(xid_memory.state_file(state), BOOT)
    assert memory is not None and memory.last_seq == 812
    (tally,) = memory.xids.values()
    assert (tally.count, tally.last_event.xid, tally.last_event.pci_bus_id) == (1, 79, "0000:3b:00")
    assert xid_memory.save(xid_memory.state_file(state), memory)
    assert on_disk(state / xid_memory.STATE_FILE_NAME)["version"] == xid_memory.VERSION


def test_the_previous_infiniband_history_is_read(tmp_path: Path) -> None:
    state = previous(tmp_path, "infiniband.json")
    history = CounterHistory(state, DEFAULT_THRESHOLDS, 600.0)
    ports = history.load(BOOT)
    assert ports["mlx5_0/1"]["counters"] == {"link_downed": 1, "symbol_error": 3}
    assert history.recent_flaps(ports["mlx5_0/1"]["flaps"], NOW) == [NOW - 60]


def test_the_previous_remediation_state_is_read_not_set_aside(tmp_path: Path) -> None:
    state = previous(tmp_path, "remediation-state.json")
    r = remediator(state, httpx.MockTransport(lambda request: httpx.Response(500)), {})
    guard = r.load_guard()
    assert r.disabled is None and r.state_invalid == 0 and not guard.state.breaker_open
    assert guard.state.actions == [{"action": "restart_vllm", "at": NOW - 300}]
    assert sorted(p.name for p in state.iterdir()) == ["remediation-state.json"]  # nothing set aside


def test_the_previous_incidents_are_read(tmp_path: Path) -> None:
    state = previous(tmp_path, "incidents.jsonl")
    tracker = IncidentTracker(state)
    assert [(i.problem, i.recovery_s) for i in tracker.closed] == [("vllm: VLLM_DEAD", 200.0)]
    assert tracker.open is not None and tracker.open.problem == "ray: RAY_NODE_DEAD"


@pytest.mark.parametrize("name", ["logs_offsets.json", "bench-last.json"])
def test_an_unnumbered_file_is_migrated_on_read(tmp_path: Path, name: str) -> None:
    state = previous(tmp_path, name)
    doc = StateFile(state / name).read()
    assert doc == {**on_disk(state / name), "version": 1}


def test_a_newer_format_is_read_for_what_is_known(tmp_path: Path) -> None:
    state = previous(tmp_path, "infiniband.json")
    doc = on_disk(state / "infiniband.json")
    (state / "infiniband.json").write_text(json.dumps({**doc, "version": 7, "new": {"x": 1}}))
    ports = CounterHistory(state, DEFAULT_THRESHOLDS, 600.0).load(BOOT)
    assert ports["mlx5_0/1"]["counters"] == {"link_downed": 1, "symbol_error": 3}  # kept, not started afresh


@pytest.mark.parametrize("version", ["1", True, -1, 1.5, None])
def test_a_version_that_is_no_format_number_is_corrupt(tmp_path: Path, version: object) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"version": version}))
    with pytest.raises(ValueError, match="is not a format number"):
        StateFile(path).read()
    assert StateFile(path).load() == {}


def test_a_format_without_a_migration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"version": 1}))
    with pytest.raises(ValueError, match="no migration from format 1 to 2"):
        StateFile(path, version=2).read()
    doc = StateFile(path, version=2, migrations={1: lambda d: {**d, "added": True}}).read()
    assert doc == {"version": 2, "added": True}

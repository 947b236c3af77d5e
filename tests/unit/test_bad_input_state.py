"""Checks that keep state across restarts, started on a corrupted state file: they run (rebuilding what they
cannot read) instead of failing every run from then on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace
from test_infiniband import Clock, check, make_env

from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from fuzzing import FUZZ, json_mutants, json_values

CORRUPT_BYTES = st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()))


@pytest.fixture(scope="module")
def ib_seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    """A sysfs tree, and the name and content of the state file one infiniband run leaves behind."""
    root = tmp_path_factory.mktemp("ib")
    clock = Clock()
    ib = check(make_env(root, "dgx_ndr_degraded.txt", clock), expected_ports=8, min_rate_gbps=400)
    ib.run()
    clock.t += 30
    ib.run()
    (state_file,) = (root / "state").iterdir()
    return root, state_file.name, json.loads(state_file.read_text())


@FUZZ
@given(data=st.data())
def test_infiniband_runs_on_a_corrupt_state_file(
    ib_seed: tuple[Path, str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    seed_root, name, state = ib_seed
    state_dir = tmp_path_factory.mktemp("ib-state")  # the sysfs and proc trees are only read: shared, not copied
    raw = data.draw(st.one_of(json_mutants([state]).map(lambda d: json.dumps(d).encode()), CORRUPT_BYTES))
    (state_dir / name).write_bytes(raw)
    clock = Clock(1_764_460_800.0 + 60)
    env = replace(make_env(seed_root, None, clock), state_dir=state_dir)
    ib = check(env, expected_ports=8, min_rate_gbps=400)
    first = ib.run()
    assert first.status is not Status.UNKNOWN, first.findings
    clock.t += 30
    assert ib.run().status is not Status.UNKNOWN


@FUZZ
@given(data=st.data())
def test_logs_check_runs_on_a_corrupt_state_file(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    root = tmp_path_factory.mktemp("logs")
    log = root / "vllm.log"
    log.write_text("INFO loading\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    clock = Clock()
    settings = LogsSettings(vllm_paths=[str(log)], ray_paths=[], from_start=True)
    LogsCheck(settings, Environment(state_dir=root / "state", clock=clock, one_shot=False)).run()  # the daemon saves
    (state_file,) = (root / "state").iterdir()
    state = json.loads(state_file.read_text())
    raw = data.draw(st.one_of(json_mutants([state]).map(lambda d: json.dumps(d).encode()), CORRUPT_BYTES))
    state_file.write_bytes(raw)
    clock.t += 5
    with log.open("a") as fh:
        fh.write("INFO more\n")
    result = LogsCheck(settings, Environment(state_dir=root / "state", clock=clock, one_shot=False)).run()
    assert result.status is not Status.UNKNOWN, result.findings

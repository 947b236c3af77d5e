"""The check model, the runner's guarantees, config validation and the JSON report shape."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from dgxdoctor.checks.base import CheckRunner, CheckSettings
from dgxdoctor.commands.config_doc import example_config
from dgxdoctor.commands.report import report_dict, report_table
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Sample, Status, exit_code, overall_status


class _Settings(CheckSettings):
    pass


class _FnCheck:
    """A test-only check whose run() is whatever the test passes."""

    name: ClassVar[str] = "probe"
    settings_model: ClassVar[type[CheckSettings]] = _Settings

    def __init__(self, fn, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn
        self.settings = _Settings(timeout_s=timeout_s)

    def run(self) -> CheckResult:
        return self.fn()  # type: ignore[no-any-return]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_worst_status_ranks_faults_over_unknown_over_ok() -> None:
    assert Status.worst([Status.OK, Status.SKIPPED]) is Status.OK
    assert Status.worst([Status.SKIPPED], default=Status.SKIPPED) is Status.SKIPPED
    assert Status.worst([Status.UNKNOWN, Status.OK]) is Status.UNKNOWN
    assert Status.worst([Status.UNKNOWN, Status.WARNING]) is Status.WARNING
    assert Status.worst([Status.WARNING, Status.CRITICAL, Status.UNKNOWN]) is Status.CRITICAL


@pytest.mark.parametrize(
    ("status", "code"),
    [(Status.OK, 0), (Status.SKIPPED, 0), (Status.WARNING, 1), (Status.CRITICAL, 2), (Status.UNKNOWN, 3)],
)
def test_exit_code_follows_nagios(status: Status, code: int) -> None:
    assert exit_code(status) == code


def test_builder_status_is_worst_finding_and_absent_values_are_dropped() -> None:
    spec = MetricSpec("dgxdoctor_test_value", "a test value", labels=("gpu",))
    b = ResultBuilder("probe")
    b.sample(spec, None, gpu="0")
    b.sample(spec, 3, gpu="1")
    b.add(Finding("A", Status.WARNING, "warned", remedy="do a thing"))
    b.add(Finding("B", Status.OK, "fine"))
    result = b.build("summary")
    assert result.status is Status.WARNING
    assert [s.labels["gpu"] for s in result.samples] == ["1"]
    assert result.action is not None and result.action.remedy == "do a thing"


def test_sample_labels_must_match_the_declared_ones() -> None:
    spec = MetricSpec("dgxdoctor_test_value", "a test value", labels=("gpu",))
    with pytest.raises(ValueError, match="do not match"):
        Sample(spec, 1.0, {"device": "x"})


async def test_runner_turns_exceptions_into_unknown() -> None:
    def boom() -> CheckResult:
        raise RuntimeError("NVML exploded")

    result = await CheckRunner(Environment()).run(_FnCheck(boom))
    assert result.status is Status.UNKNOWN
    assert result.error == "RuntimeError: NVML exploded"
    assert result.check == "probe"


async def test_runner_reports_a_hang_and_never_stacks_a_second_run() -> None:
    release = threading.Event()
    calls: list[int] = []

    def hang() -> CheckResult:
        calls.append(1)
        release.wait(10)
        return CheckResult("probe", Status.OK, "late")

    runner = CheckRunner(Environment())
    check = _FnCheck(hang, timeout_s=0.05)
    first = await runner.run(check)
    assert first.status is Status.UNKNOWN
    assert "did not answer in 0.05 s" in (first.error or "")
    second = await runner.run(check)
    assert second.status is Status.UNKNOWN
    assert "hung" in (second.error or "")
    assert len(calls) == 1, "a second thread must not start while the first is stuck"
    assert runner.timeouts_total["probe"] == 1
    release.set()


async def test_runner_records_duration_and_start() -> None:
    env = Environment(clock=lambda: 1234.5)
    result = await CheckRunner(env).run(_FnCheck(lambda: CheckResult("probe", Status.OK, "fine")))
    assert result.started_at == 1234.5
    assert result.duration_s >= 0


def test_the_blocking_one_shot_gives_what_the_loop_gives() -> None:
    """``dgxdoctor check`` waits on its own thread (no asyncio): an exception and a hang are UNKNOWN as on the loop,
    each run has its own timeout from the common start and its own duration (not the time until it was looked at,
    after a slower one), and a hung check is never run twice."""
    release = threading.Event()
    calls: list[int] = []

    def boom() -> CheckResult:
        raise RuntimeError("NVML exploded")

    def hang() -> CheckResult:
        calls.append(1)
        release.wait(10)
        return CheckResult("hang", Status.OK, "late")

    fine = _FnCheck(lambda: CheckResult("other", Status.OK, "fine"))
    broken, stuck = _FnCheck(boom), _FnCheck(hang, timeout_s=0.05)
    stuck.name = "hang"  # type: ignore[misc]
    runner = CheckRunner(Environment(clock=lambda: 1234.5))
    try:
        first = runner.run_once_blocking([broken, stuck, fine])
        assert [r.check for r in first] == ["probe", "hang", "probe"]
        assert first[1].duration_s >= 0.05 > first[2].duration_s
        assert first[0].status is Status.UNKNOWN and first[0].error == "RuntimeError: NVML exploded"
        assert first[1].status is Status.UNKNOWN and "did not answer in 0.05 s" in (first[1].error or "")
        assert first[1].timeouts == ("run",)
        assert first[2].status is Status.OK and first[2].summary == "fine" and first[2].started_at == 1234.5
        again = runner.run_once_blocking([stuck])
        assert "hung" in (again[0].error or "") and len(calls) == 1
        assert runner.timeouts_total == {"hang": 1}
    finally:
        release.set()


def test_config_reports_every_bad_key_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"nodee": "x", "paths": {"sysfs_root": 5, "bogus": 1}}, "test.toml")
    problems = dict(info.value.problems)
    assert problems["nodee"] == "unknown table (did you mean 'node'?)"
    assert problems["paths"] in (  # msgspec names the first problem of the table, in the order of the file
        "expected a path (string), got int - at `$.paths.sysfs_root`",
        "Object contains unknown field `bogus` - at `$.paths`",
    )
    assert "test.toml" in str(info.value)


def test_defaults_validate_and_the_example_config_round_trips() -> None:
    from dgxdoctor.compat import tomllib

    config = parse_config({})
    assert config.paths.kmsg_path.as_posix() == "/dev/kmsg"
    parse_config(tomllib.loads(example_config()))


def test_report_shape_and_table() -> None:
    results = [
        CheckResult("a", Status.OK, "fine"),
        ResultBuilder("b").build("nothing"),
        CheckResult.skipped("c", "no GPU here"),
    ]
    b = ResultBuilder("d")
    b.add(Finding("X", Status.CRITICAL, "broken", "gpu0", remedy="reset it"))
    results.append(b.build("one fault"))
    doc = report_dict("n1", results)
    assert doc["node"] == "n1" and doc["status"] == "critical" and doc["group"] == "default"
    assert set(doc["checks"][3]) == {"name", "status", "summary", "findings", "action", "duration_s", "error"}
    assert doc["checks"][3]["findings"][0] == {
        "code": "X",
        "status": "critical",
        "subject": "gpu0",
        "message": "broken",
        "evidence": None,
        "remedy": "reset it",
        "action": "none",  # what follows from it: judge/ decides (judge.consequence); an unknown code asks nothing
        "cure": "n/a",
        "group": "default",  # the node's serving group ([node] group unset)
    }
    assert overall_status(results[:3]) is Status.OK
    table = report_table("n1", results)
    assert "CRIT" in table and "remedy: reset it" in table and "SKIP" in table

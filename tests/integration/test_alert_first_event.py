"""Every shipped alert fires on its first event after a cold start (``first_event_alerts.FIRST_EVENT``).

``increase()`` sees no increase in a series' first sample: a counter born at its first count (the first NCCL
watchdog timeout counted at 1 or 2, the first failed restart) never fires an alert on ``increase(...) > 0``; it
fires on the second event. Each row is run under ``promtool test rules`` against what ``dgxdoctor rules`` prints,
with every series absent for the first scrapes. The scenarios run the real code path of the daemon's exposition
(the check through the scheduler and the store, remediation with a command that fails, the collectors) and turn
its successive scrapes into the input series, so a counter appears exactly as a scrape would find it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from first_event_alerts import ABSENT, FIRST_EVENT, STEP_S, Gauges, Scenario
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_alert_rules import ALERTS, expect, promtool, rules  # noqa: F401  (rules: the module fixture)

from conftest import FIXTURES

pytestmark = pytest.mark.integration

# Scrapes after the absent ones: the agent up (checks declared, none run yet), then one scrape per step of the
# scenario; the last one repeats (the daemon keeps exporting it) for this many scrapes more.
TAIL = 40


def test_every_shipped_alert_has_a_row() -> None:
    assert sorted(set(ALERTS) - set(FIRST_EVENT)) == [], "add a row to tests/integration/first_event_alerts.py"
    assert sorted(set(FIRST_EVENT) - set(ALERTS)) == [], "a row for an alert that is not shipped"


def test_every_row_starts_absent() -> None:
    for name, row in FIRST_EVENT.items():
        if isinstance(row, Gauges):
            assert all(not s.values.startswith("_") for s in row.series), name  # the absent ones are added


# -- the scrapes of the real code ---------------------------------------------------------------------------------

Scrapes = list[str]


def _samples(text: str, metrics: set[str]) -> dict[str, float]:
    """``{series: value}`` of the named families in one exposition."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in metrics:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def series_of(scrapes: Scrapes, metrics: set[str]) -> list[dict[str, str]]:
    """promtool input series from successive expositions: ABSENT empty scrapes, then one value per scrape (``_``
    where a scrape lacks the series), the last scrape repeated."""
    seen = [_samples(text, metrics) for text in scrapes]
    names = sorted({name for scrape in seen for name in scrape})
    out = []
    for name in names:
        values = ["_"] * ABSENT + [f"{scrape[name]:g}" if name in scrape else "_" for scrape in seen]
        out.append({"series": name, "values": " ".join(values) + f" {values[-1]}x{TAIL}"})
    return out


async def wait_run(store: Any, name: str, before: int) -> None:
    for _ in range(1000):
        if store.runs_total().get(name, 0) > before:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} did not run")


async def nccl_timeout_in_vllm_log(tmp_path: Path) -> Scrapes:
    """The logs check follows vLLM's log through the scheduler; a healthy run, then vLLM's watchdog timeout."""
    from dgxdoctor.checks.base import CheckRunner
    from dgxdoctor.checks.logs import LogsCheck, LogsSettings
    from dgxdoctor.daemon.scheduler import CheckScheduler
    from dgxdoctor.environment import Environment
    from dgxdoctor.exporters.collector import make_registry
    from dgxdoctor.fleet.store import ResultStore
    from dgxdoctor.validation import validate

    log = tmp_path / "vllm.log"
    log.write_text("INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds\n")
    env = Environment(node="dgx-a", state_dir=tmp_path / "state", one_shot=False)
    settings = validate(LogsSettings, {"vllm_paths": [str(log)], "ray_paths": [], "interval_s": 3600})
    store = ResultStore("dgx-a")
    registry = make_registry(store)
    sched = CheckScheduler(CheckRunner(env), store, heartbeat_s=60)
    sched.start()
    try:
        sched.add(LogsCheck(settings, env), first_run_in_s=3600)
        scrapes = [generate_latest(registry).decode()]  # the agent is up; the check has not run
        sched.wake("logs")
        await wait_run(store, "logs", 0)
        scrapes.append(generate_latest(registry).decode())  # a healthy run
        with log.open("a", encoding="utf-8") as fh:
            fh.write((FIXTURES / "logs" / "nccl_timeout.log").read_text())
        sched.wake("logs")
        await wait_run(store, "logs", 1)
        scrapes.append(generate_latest(registry).decode())  # the first NCCL failure
    finally:
        sched.shutdown()
    assert _samples(scrapes[-1], {"dgxdoctor_logs_signature_matches_total"}), "the line was not matched"
    return scrapes


async def restart_vllm_fails(tmp_path: Path) -> Scrapes:
    """vLLM is dead; remediation in act mode runs restart_vllm, whose command fails."""
    from dgxdoctor.config import AlertsSettings, RemediationSettings
    from dgxdoctor.daemon.remediation import make_pager
    from dgxdoctor.environment import Environment
    from dgxdoctor.exporters.remediation import RemediationCollector
    from dgxdoctor.judge.consequence import judged_result
    from dgxdoctor.remediation.actions import VllmTarget
    from dgxdoctor.remediation.audit import guard_state_file
    from dgxdoctor.remediation.engine import Remediator, Targets
    from dgxdoctor.result import CheckResult, Finding, Status
    from dgxdoctor.validation import validate

    # As the check runner hands it to the store: with what follows from the finding (its action, restart_vllm).
    dead = judged_result(
        CheckResult("vllm", Status.CRITICAL, "dead", (Finding("VLLM_DEAD", Status.CRITICAL, "refused"),))
    )
    env = Environment(node="dgx-a", http_transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    settings = validate(
        RemediationSettings,
        {"mode": "act", "role": "head", "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 1, "drain": False,
         "commands": {"restart_vllm": ["false"]}},
    )  # fmt: skip
    pager = make_pager(AlertsSettings(), env)
    targets = Targets(VllmTarget("http://vllm:8000", "tiny"), "http://ray:8265", 2, 16, (), "t" * 16)
    state = tmp_path / "state"
    state.mkdir()
    r = Remediator(settings, pager, "dgx-a", state, targets, lambda: {"vllm": dead}, env=env)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RemediationCollector(lambda: "dgx-a", r.metrics))
    scrapes = [generate_latest(registry).decode()]  # the agent is up, nothing decided yet
    await r.evaluate()
    for _ in range(3000):
        if not r.busy.locked() and guard_state_file(state).read().get("in_flight") is None:
            break
        await asyncio.sleep(0.01)
    scrapes.append(generate_latest(registry).decode())  # the first restart, failed
    failed = 'dgxdoctor_remediation_actions_total{action="restart_vllm",node="dgx-a",outcome="failed"}'
    assert _samples(scrapes[-1], {"dgxdoctor_remediation_actions_total"}).get(failed) == 1, "no restart ran"
    return scrapes


async def nvidia_smi_hangs(tmp_path: Path) -> Scrapes:
    """The topology check through the scheduler, with nvidia-smi hanging past its timeout at the first run."""
    from dgxdoctor.checks.base import CheckRunner
    from dgxdoctor.checks.topology import TopologyCheck, TopologySettings
    from dgxdoctor.daemon.scheduler import CheckScheduler
    from dgxdoctor.environment import Environment
    from dgxdoctor.exporters.collector import make_registry
    from dgxdoctor.fleet.store import ResultStore
    from dgxdoctor.sources.commands import CommandResult, CommandTimeout

    def hangs(argv: Any, timeout_s: float = 10.0) -> CommandResult:
        raise CommandTimeout(f"{' '.join(argv)} did not finish in {timeout_s:g} s")

    (tmp_path / "proc").mkdir()
    env = Environment(node="dgx-a", sysfs_root=tmp_path, proc_root=tmp_path / "proc", state_dir=tmp_path,
                      run_command=hangs)  # fmt: skip
    store = ResultStore("dgx-a")
    registry = make_registry(store)
    sched = CheckScheduler(CheckRunner(env), store, heartbeat_s=60)
    sched.start()
    try:
        sched.add(TopologyCheck(TopologySettings(interval_s=3600), env), first_run_in_s=3600)
        scrapes = [generate_latest(registry).decode()]
        sched.wake("topology")
        await wait_run(store, "topology", 0)
        scrapes.append(generate_latest(registry).decode())
    finally:
        sched.shutdown()
    return scrapes


SCENARIOS: dict[str, tuple[Callable[[Path], Awaitable[Scrapes]], set[str]]] = {
    "nccl_timeout_in_vllm_log": (nccl_timeout_in_vllm_log, {"dgxdoctor_logs_signature_matches_total"}),
    "restart_vllm_fails": (restart_vllm_fails, {"dgxdoctor_remediation_actions_total"}),
    "nvidia_smi_hangs": (nvidia_smi_hangs, {"dgxdoctor_check_timeouts_total", "dgxdoctor_probe_timeouts_total"}),
}


# -- the rows under promtool ---------------------------------------------------------------------------------------


def gauge_series(row: Gauges) -> list[dict[str, str]]:
    out = []
    for s in row.series:
        labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
        out.append({"series": f"{s.metric}{{{labels}}}", "values": " ".join(["_"] * ABSENT + [s.values])})
    return out


def run_row(tmp_path: Path, rules_file: Path, name: str, inputs: list[dict[str, str]], row: Gauges | Scenario) -> None:
    value = row.value if isinstance(row, Gauges) else ""
    quiet = f"{(ABSENT - 1) * STEP_S}s"  # the last scrape before the agent's first series
    cases = [
        {"eval_time": quiet, "alertname": name, "exp_alerts": []},
        {"eval_time": row.fires_at, "alertname": name, "exp_alerts": [expect(name, value, **row.labels)]},
    ]
    doc = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": f"{STEP_S}s",
        "tests": [{"interval": f"{STEP_S}s", "input_series": inputs, "alert_rule_test": cases}],
    }
    path = tmp_path / "first_event_test.yml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, f"{name} does not fire on its first event:\n{json.dumps(inputs)}\n" + re.sub(
        r"\n{3,}", "\n\n", done.stdout + done.stderr
    )


@pytest.mark.parametrize("name", sorted(FIRST_EVENT))
def test_fires_on_its_first_event(tmp_path: Path, rules: Path, name: str) -> None:  # noqa: F811
    row = FIRST_EVENT[name]
    if isinstance(row, Scenario):
        scenario, metrics = SCENARIOS[row.name]
        inputs = series_of(asyncio.run(scenario(tmp_path)), metrics)
    else:
        inputs = gauge_series(row)
    run_row(tmp_path, rules, name, inputs, row)

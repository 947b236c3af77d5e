"""Incidents: first detection to the first good completion after it; the histogram moves once per incident; the
figures survive a restart of the agent; the exposition carries them."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dgxdoctor.exporters.incidents import IncidentCollector
from dgxdoctor.fleet.incidents import CANARY_METRIC, IncidentTracker
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Finding, MetricSpec, Sample, Status

CANARY = MetricSpec(CANARY_METRIC, "canary latency", labels=("model",))


def vllm(status: Status, at: float, canary: bool = True) -> CheckResult:
    samples = (Sample(CANARY, 0.12, {"model": "tiny"}),) if canary else ()
    findings = (Finding("VLLM_DEAD", Status.CRITICAL, "refused"),) if status is Status.CRITICAL else ()
    return CheckResult("vllm", status, status.value, findings, samples, started_at=at, duration_s=0.5)


def scrape(tracker: IncidentTracker, now: float = 10_000.0) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(IncidentCollector(lambda: "dgx-a", tracker, clock=lambda: now))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            le = s.labels.get("le")
            out[s.name + (f"{{le={le}}}" if le else "")] = s.value
    return out


def test_one_incident_is_one_observation_from_detection_to_good_completion(tmp_path: Path) -> None:
    store = ResultStore("dgx-a")
    tracker = IncidentTracker(tmp_path)
    store.listeners.append(tracker.observe)
    store.put(vllm(Status.OK, 1000.0))
    assert scrape(tracker)["dgxdoctor_incident_recovery_seconds_count"] == 0.0
    store.put(vllm(Status.CRITICAL, 1010.0, canary=False))  # detected at 1010.5
    store.put(vllm(Status.CRITICAL, 1020.0, canary=False))  # still the same incident
    store.put(CheckResult("infiniband", Status.CRITICAL, "port down", started_at=1025.0))
    m = scrape(tracker)
    assert m["dgxdoctor_incident_open"] == 1.0 and m["dgxdoctor_incident_last_detected_timestamp_seconds"] == 1010.5
    assert m["dgxdoctor_incident_recovery_seconds_count"] == 0.0
    store.put(vllm(Status.WARNING, 1100.0))  # the first good completion after it: recovered at 1100.5
    store.put(vllm(Status.OK, 1110.0))
    m = scrape(tracker)
    assert (
        m["dgxdoctor_incident_recovery_seconds_count"] == 1.0 and m["dgxdoctor_incident_recovery_seconds_sum"] == 90.0
    )
    assert m["dgxdoctor_incident_recovery_seconds_bucket{le=60.0}"] == 0.0
    assert m["dgxdoctor_incident_recovery_seconds_bucket{le=120.0}"] == 1.0
    assert m["dgxdoctor_incident_open"] == 0.0 and m["dgxdoctor_incident_since_last_seconds"] == 10_000.0 - 1010.5
    # A second incident moves it once more, and only once.
    store.put(vllm(Status.CRITICAL, 2000.0, canary=False))
    store.put(vllm(Status.OK, 2030.0))
    store.put(vllm(Status.OK, 2040.0))
    assert scrape(tracker)["dgxdoctor_incident_recovery_seconds_count"] == 2.0
    lines = [json.loads(line) for line in (tmp_path / "incidents.jsonl").read_text().splitlines()]
    assert [(r["problem"], r["recovered_at"]) for r in lines] == [
        ("vllm: VLLM_DEAD", None), ("vllm: VLLM_DEAD", 1100.5), ("vllm: VLLM_DEAD", None), ("vllm: VLLM_DEAD", 2030.5)
    ]  # fmt: skip


def test_the_action_taken_is_recorded_and_the_figures_survive_a_restart(tmp_path: Path) -> None:
    tracker = IncidentTracker(tmp_path, lambda start, end: ["restart_vllm success"] if start < 1050 < end else [])
    tracker.observe(vllm(Status.OK, 1000.0))
    tracker.observe(vllm(Status.CRITICAL, 1010.0, canary=False))
    tracker.observe(vllm(Status.OK, 1200.0))
    tracker.observe(vllm(Status.CRITICAL, 3000.0, canary=False))  # open when the agent stops
    again = IncidentTracker(tmp_path)
    assert again.histogram()[2] == 1 and again.summary()["open"] is True
    assert again.closed[0].action == "restart_vllm success"
    assert scrape(again)["dgxdoctor_incident_last_detected_timestamp_seconds"] == 3000.5


def test_a_node_serving_no_completion_recovers_when_nothing_is_critical(tmp_path: Path) -> None:
    tracker = IncidentTracker(None)
    tracker.observe(CheckResult("vllm", Status.SKIPPED, "no vLLM here (worker)", started_at=1.0))
    tracker.observe(CheckResult("ray", Status.CRITICAL, "raylet dead", started_at=100.0))
    tracker.observe(CheckResult("infiniband", Status.CRITICAL, "port down", started_at=110.0))
    tracker.observe(CheckResult("ray", Status.OK, "back", started_at=150.0))
    assert tracker.summary()["open"] is True  # the port is still down
    tracker.observe(CheckResult("infiniband", Status.OK, "up", started_at=200.0))
    assert tracker.summary()["open"] is False and tracker.histogram()[2] == 1


def test_peer_compare_is_the_other_nodes_incident(tmp_path: Path) -> None:
    tracker = IncidentTracker(None)
    tracker.observe(CheckResult("peer_compare", Status.CRITICAL, "dgx-b lost a rail", started_at=5.0))
    assert tracker.summary() == {"open": False, "last": None, "count": 0}
    assert "dgxdoctor_incident_since_last_seconds" not in scrape(tracker)  # absent before the first, never 0


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "incidents.jsonl").write_text('{"detected_at": 5, "problem": "x", "recovered_at": 65}\n{"detec')
    assert IncidentTracker(tmp_path).histogram() == ([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], 60.0, 1)

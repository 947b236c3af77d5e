from __future__ import annotations

import json
import math

from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Finding, Sample, Status
from fakechecks import GPU_UTIL, gpu_result


def test_transition_only_when_status_changes() -> None:
    store = ResultStore("dgx-a")
    first = store.put(CheckResult("gpu", Status.OK, "fine"))
    assert first is not None and first.old is None and first.new is Status.OK
    assert store.put(CheckResult("gpu", Status.OK, "still fine")) is None
    t = store.put(CheckResult("gpu", Status.CRITICAL, "bad", findings=(Finding("XID_79", Status.CRITICAL, "gone"),)))
    assert t is not None and (t.old, t.new) == (Status.OK, Status.CRITICAL)
    store.put(CheckResult("gpu", Status.CRITICAL, "bad"))
    assert store.runs_total() == {"gpu": 4}


def test_snapshot_shape_and_facts() -> None:
    store = ResultStore("dgx-a", clock=lambda: 1000.0)
    store.put(gpu_result())
    store.put(CheckResult("ib", Status.OK, "ok", facts={"host_ip": "10.0.0.1"}))
    doc = json.loads(json.dumps(store.snapshot()))
    assert doc["node"] == "dgx-a" and doc["status"] == "ok" and doc["generated_at"] == 1000.0
    gpu = next(c for c in doc["checks"] if c["name"] == "gpu")
    assert {"name", "status", "summary", "findings", "samples", "started_at", "facts", "duration_s"} <= set(gpu)
    assert gpu["samples"][0] == {
        "name": "dgxdoctor_gpu_memory_used_bytes",
        "labels": {"gpu": "0", "pci_bus_id": "00000000:18:00.0"},
        "value": 60 * 2**30,
    }
    assert doc["facts"] == {"driver_version": "580.159.04", "gpu_count": "2", "host_ip": "10.0.0.1"}
    assert [c["name"] for c in store.snapshot(exclude=("gpu",))["checks"]] == ["ib"]


def test_non_finite_values_travel_as_null() -> None:
    store = ResultStore("n")
    labels = {"gpu": "0", "pci_bus_id": "x"}
    store.put(CheckResult("gpu", Status.OK, "ok", samples=(Sample(GPU_UTIL, math.nan, labels),)))
    text = json.dumps(store.snapshot(), allow_nan=False)
    assert json.loads(text)["checks"][0]["samples"][0]["value"] is None


def test_forget_removes_everything() -> None:
    store = ResultStore("n")
    store.put(gpu_result())
    store.forget("gpu")
    assert store.latest() == {} and store.runs_total() == {} and store.facts() == {}

"""No restart that cannot help: a vLLM failure while an XID 79 (or another hardware cause) is active is refused,
audited with the finding, and paged once with both facts; without the cause the restart runs as before."""

from __future__ import annotations

import json
from pathlib import Path

from test_remediation_engine import DEAD, events, remediator, settle, vllm_app

from dgxdoctor.remediation.guard import Decision
from dgxdoctor.remediation.hardware_gate import HardwareGate, causes
from dgxdoctor.remediation.policy import Problem
from dgxdoctor.result import CheckResult, Finding, MetricSpec, Sample, Status

XID_79_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
LAST_SEEN = MetricSpec("dgxdoctor_xid_last_seen_timestamp_seconds", "t", "gauge", ("pci_bus_id", "xid"))
GPU_INFO = MetricSpec("dgxdoctor_gpu_info", "i", "info", ("gpu", "pci_bus_id", "uuid", "model"))
AT_1203 = 1764590580.0  # 2025-12-01 12:03 UTC


def xid_79() -> CheckResult:
    finding = Finding("XID_79", Status.CRITICAL, "XID 79 on 0000:3b:00", "0000:3b:00", evidence=XID_79_LINE)
    sample = Sample(LAST_SEEN, AT_1203, {"pci_bus_id": "0000:3b:00", "xid": "79"})
    return CheckResult("xid", Status.CRITICAL, "XID 79", (finding,), samples=(sample,))


def gpu_table() -> CheckResult:
    labels = {"gpu": "3", "pci_bus_id": "00000000:3B:00.0", "uuid": "GPU-x", "model": "H200"}
    return CheckResult("gpu", Status.OK, "8 GPUs", samples=(Sample(GPU_INFO, 1.0, labels),))


def test_the_cause_names_the_gpu_by_index_and_the_time() -> None:
    (cause,) = causes({"xid": xid_79(), "gpu": gpu_table()}, "dgx-a")
    assert cause.text == "XID 79 on GPU 3 of dgx-a at 12:03 UTC"


def test_an_xid_the_application_causes_is_no_cause() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python3, Graphics SM Warp Exception"
    finding = Finding("XID_13", Status.CRITICAL, "repeated", "0000:3b:00", evidence=line)
    assert causes({"xid": CheckResult("xid", Status.CRITICAL, "13", (finding,))}, "dgx-a") == []


async def test_vllm_down_with_xid_79_is_refused_and_paged_once_not_restarted(tmp_path: Path) -> None:
    seen: list[str] = []
    r = remediator(tmp_path, vllm_app(seen), {"vllm": DEAD, "xid": xid_79(), "gpu": gpu_table()})
    await settle(r)
    await settle(r)
    log = events(tmp_path)
    assert not [e for e in log if e["event"] in ("action_started", "action")]
    (decision,) = [e for e in log if e["event"] == "decision"]
    assert decision["verdict"] == "refuse" and "XID_79" in decision["reason"]
    assert "vLLM down on dgx-a; cause: XID 79 on GPU 3 of dgx-a at 12:03 UTC" in decision["reason"]
    (page,) = [e for e in log if e["event"] == "page"]
    assert page["outcome"] == "sent"
    (posted,) = [json.loads(body) for body in seen if body.startswith("[")]
    assert posted[0]["annotations"]["description"] == "vLLM down on dgx-a; cause: XID 79 on GPU 3 of dgx-a at 12:03 UTC"
    assert "GET /health" not in seen  # nothing was restarted, so nothing verified


def test_pages_again_only_for_a_new_cause() -> None:
    gate = HardwareGate()
    d = Decision(
        "act", "restart_vllm", "held", Problem("check:vllm:restart_vllm", "restart_vllm", "check", "VLLM_DEAD")
    )
    found = causes({"xid": xid_79()}, "dgx-a")
    assert len(gate.apply([d], found, "dgx-a")[1]) == 1
    assert gate.apply([d], found, "dgx-a")[1] == []
    decisions, pages = gate.apply([d], [], "dgx-a")
    assert decisions == [d] and pages == []


def test_a_peer_fault_relayed_by_peer_compare_gates_this_node() -> None:
    from dgxdoctor.judge.hardware_cause import peer_causes

    doc = {
        "node": "dgx-b",
        "checks": [
            {"check": "xid", "findings": [{"code": "XID_79", "status": "critical", "subject": "0000:3b:00"}]},
            {"check": "xid", "findings": [{"code": "XID_13", "status": "critical", "subject": "0000:3b:00"}]},
            {"check": "driver_stack", "findings": [{"code": "DRIVER_FABRIC_MANAGER_DOWN", "status": "critical",
                                                    "subject": "nvidia-fabricmanager.service", "message": "failed"}]},
        ],
    }  # fmt: skip
    texts = peer_causes(doc)
    assert texts == ["XID 79 on 0000:3b:00 of dgx-b", "DRIVER_FABRIC_MANAGER_DOWN on dgx-b: failed"]
    relayed = Finding("PEER_HARDWARE_FAULT", Status.WARNING, texts[0], "dgx-b")
    results = {"vllm": DEAD, "peer_compare": CheckResult("peer_compare", Status.WARNING, "x", (relayed,))}
    (cause,) = causes(results, "dgx-a")
    problem = Problem("check:vllm:restart_vllm", "restart_vllm", "check", "VLLM_DEAD: refused")
    decisions, pages = HardwareGate().apply([Decision("act", "restart_vllm", "held", problem)], [cause], "dgx-a")
    assert decisions[0].verdict == "refuse"
    assert pages[0].reason == "vLLM down on dgx-a; cause: XID 79 on 0000:3b:00 of dgx-b"

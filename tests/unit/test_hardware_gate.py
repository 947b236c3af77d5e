"""No restart that cannot help: a vLLM failure while an XID 79 (or another hardware cause) is active is refused,
audited with the finding, and paged once with both facts; without the cause the restart runs as before."""

from __future__ import annotations

import json
from pathlib import Path

from test_remediation_engine import DEAD, events, remediator, settle, vllm_app

from dgxdoctor.checks.gpu import GPU_INFO
from dgxdoctor.checks.xid import XID_LAST_SEEN as LAST_SEEN
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.fleet.peers import validate_state
from dgxdoctor.judge.consequence import judged
from dgxdoctor.judge.hardware_cause import peer_cause_findings, peer_causes
from dgxdoctor.judge.xid import assess_xid, escalate, xid_finding
from dgxdoctor.remediation.guard import Decision
from dgxdoctor.remediation.hardware_gate import HardwareGate, causes
from dgxdoctor.remediation.policy import Problem, problem_from_alert, problems_from_results
from dgxdoctor.result import CheckResult, Cure, Finding, Sample, Status
from dgxdoctor.sources.xid import load_catalog, parse_xid_line

XID_79_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
XID_13_LINE = "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python3, Graphics SM Warp Exception"
AT_1203 = 1764590580.0  # 2025-12-01 12:03 UTC


def xid(line: str, repeats: int = 1) -> Finding:
    """The xid check's finding for one line (judge/xid.py's verdict, repeats escalated as the check does)."""
    event = parse_xid_line(line)
    assert event is not None
    entry = load_catalog().xid(event.xid)
    return xid_finding(event, entry.name, repeats, 60.0, escalate(assess_xid(event, entry), repeats, 3))


def xid_79() -> CheckResult:
    sample = Sample(LAST_SEEN, AT_1203, {"pci_bus_id": "0000:3b:00", "xid": "79"})
    return CheckResult("xid", Status.CRITICAL, "XID 79", (xid(XID_79_LINE),), samples=(sample,))


def gpu_table() -> CheckResult:
    labels = {"gpu": "3", "pci_bus_id": "00000000:3B:00.0", "uuid": "GPU-x", "model": "H200"}
    return CheckResult("gpu", Status.OK, "8 GPUs", samples=(Sample(GPU_INFO, 1.0, labels),))


def test_the_cause_names_the_gpu_by_index_and_the_time() -> None:
    (cause,) = causes({"xid": xid_79(), "gpu": gpu_table()}, "dgx-a")
    assert cause.text == "XID 79 on GPU 3 of dgx-a at 12:03 UTC"


def test_the_xid_verdict_carries_its_cure() -> None:
    assert (xid(XID_79_LINE).action, xid(XID_79_LINE).cure) == ("page", Cure.HARDWARE)


def test_an_xid_the_application_causes_is_no_cause() -> None:
    """XID 13 repeated is critical (contact support: paged), but the GPU is not broken: no restart is refused."""
    finding = xid(XID_13_LINE, repeats=3)
    assert (finding.status, finding.action, finding.cure) == (Status.CRITICAL, "page", Cure.PERSON)
    assert causes({"xid": CheckResult("xid", Status.CRITICAL, "13", (finding,))}, "dgx-a") == []


def test_the_gate_reads_the_cure_not_the_code() -> None:
    """A finding is a cause when judge/ marked it so; its code and message are not read again."""
    bare = Finding("GPU_LOST", Status.CRITICAL, "lost")
    assert causes({"gpu": CheckResult("gpu", Status.CRITICAL, "x", (bare,))}, "dgx-a") == []
    lost = judged(bare)
    assert (lost.action, lost.cure) == ("page", Cure.HARDWARE)
    (cause,) = causes({"gpu": CheckResult("gpu", Status.CRITICAL, "x", (lost,))}, "dgx-a")
    assert cause.text == "GPU_LOST on dgx-a: lost"


async def test_vllm_down_with_xid_79_is_refused_and_paged_once_not_restarted(tmp_path: Path) -> None:
    seen: list[str] = []
    r = remediator(tmp_path, vllm_app(seen), {"vllm": DEAD, "xid": xid_79(), "gpu": gpu_table()})
    await settle(r)
    await settle(r)
    log = events(tmp_path)
    assert not [e for e in log if e["event"] in ("action_started", "action")]
    decisions = {e["problem"]: e for e in log if e["event"] == "decision"}
    # The XID's own page is suggested (the alert rules page for it); the restart is refused with it as the cause.
    assert decisions["check:xid:page"]["verdict"] == "suggest"
    decision = decisions["check:vllm:restart_vllm"]
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


def peer_state() -> dict[str, object]:
    """The peer's /state as its daemon writes it (documents.ResultsDocument), its findings judged there."""
    fm = judged(Finding("DRIVER_FABRIC_MANAGER_DOWN", Status.CRITICAL, "failed", "nvidia-fabricmanager.service"))
    results = [
        CheckResult("xid", Status.CRITICAL, "x", (xid(XID_79_LINE), xid(XID_13_LINE, repeats=3))),
        CheckResult("driver_stack", Status.CRITICAL, "x", (fm,)),
        CheckResult("vllm", Status.CRITICAL, "x", (judged(Finding("VLLM_DEAD", Status.CRITICAL, "refused")),)),
    ]
    return ResultsDocument.of("dgx-b", results, 1.0).state()


def test_a_peer_fault_relayed_by_peer_compare_gates_this_node() -> None:
    doc = peer_state()
    texts = peer_causes(doc)
    assert texts == ["XID 79 on 0000:3b:00 of dgx-b", "DRIVER_FABRIC_MANAGER_DOWN on dgx-b: failed"]
    (relayed, _) = peer_cause_findings(doc, "dgx-b")
    assert (relayed.status, relayed.action, relayed.cure) == (Status.WARNING, "none", Cure.HARDWARE)
    results = {"vllm": DEAD, "peer_compare": CheckResult("peer_compare", Status.WARNING, "x", (relayed,))}
    (cause,) = causes(results, "dgx-a")
    (problem,) = problems_from_results([DEAD])
    decisions, pages = HardwareGate().apply([Decision("act", "restart_vllm", "held", problem)], [cause], "dgx-a")
    assert decisions[0].verdict == "refuse"
    assert pages[0].reason == "vLLM down on dgx-a; cause: XID 79 on 0000:3b:00 of dgx-b"


def test_a_peer_says_what_is_a_cause() -> None:
    """A peer's finding is a cause when its document says ``cure: hardware`` on a critical finding; a warning is
    none."""
    warning = {"code": "GPU_LOST", "status": "warning", "cure": "hardware", "message": "x"}
    assert peer_causes({"node": "p", "checks": [{"name": "gpu", "findings": [warning]}]}) == []
    sent = {"code": "XID_13", "status": "critical", "subject": "0000:3b:00", "cure": "person", "message": "x"}
    assert peer_causes({"node": "p", "checks": [{"name": "xid", "findings": [sent]}]}) == []


def test_a_peer_that_sends_no_cure_is_read_cautiously() -> None:
    """A peer of the previous release (results schema 1) sends no ``cure``: unknown, never "no hardware fault" (it
    was read as none before, and the head restarted the group under the peer's lost GPU). Its critical XIDs count as
    causes, its other findings as this node's table judges their codes (VLLM_DEAD: a restart cures it)."""
    doc = peer_state()
    checks = doc["checks"]
    assert isinstance(checks, list)
    for check in checks:
        for f in check["findings"]:
            f.pop("cure")
            f.pop("action")
    for key in ("schema", "agent_version"):
        doc.pop(key)
    seen = validate_state(doc)  # through the daemon's validation: the absent cure stays absent
    assert peer_causes(seen) == [
        "XID 79 on 0000:3b:00 of dgx-b",
        "XID 13 on 0000:3b:00 of dgx-b",
        "DRIVER_FABRIC_MANAGER_DOWN on dgx-b: failed",
    ]


def test_an_alerts_refusal_names_the_alert() -> None:
    """A restart asked for by an alert: the page names the alert (it said "alert on dgx-a" before)."""
    labels = {"alertname": "DgxdoctorVllmDown", "node": "dgx-a", "dgxdoctor_action": "restart_vllm"}
    problem = problem_from_alert(labels, "dgx-a", 1.0)
    assert problem is not None
    found = causes({"xid": xid_79()}, "dgx-a")
    _, pages = HardwareGate().apply([Decision("act", "restart_vllm", "held", problem)], found, "dgx-a")
    assert (
        pages[0].reason
        == "alert DgxdoctorVllmDown firing on dgx-a; cause: XID 79 on GPU 0000:3b:00 of dgx-a at 12:03 UTC"
    )

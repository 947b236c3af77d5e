"""Policy: which finding asks for which action, alerts for this node only, and the ladder."""

from __future__ import annotations

from pathlib import Path

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.policy import (
    Attempt,
    escalate,
    problem_from_alert,
    problems_from_results,
)
from dgxdoctor.result import CheckResult, Finding, Status


def result(check: str, *findings: tuple[str, Status]) -> CheckResult:
    """A result as the check runner hands it on: each finding with what judge/ says follows from it."""
    found = tuple(judged(Finding(code, status, f"{code} seen")) for code, status in findings)
    return CheckResult(check, Status.worst(f.status for f in found), "x", found)


def xid_result(tmp_path: Path, *codes: int) -> CheckResult:
    """The real xid check over a kernel log with each XID once, on a GPU of its own."""
    log = tmp_path / "kern.log"
    log.write_text("".join(f"NVRM: Xid (PCI:0000:0{i}:00): {c}, pid=7, name=python3, x\n" for i, c in enumerate(codes)))
    return XidCheck(XidSettings(), Environment(node="n1", kmsg_path=log)).run()


def test_the_action_is_the_findings_own() -> None:
    """The policy reads ``Finding.action``, as judge/ set it; it keeps no list of codes of its own."""
    assert [p.action for p in problems_from_results([result("vllm", ("VLLM_DEAD", Status.CRITICAL))])] == [
        "restart_vllm"
    ]
    bare = CheckResult("vllm", Status.CRITICAL, "x", (Finding("VLLM_DEAD", Status.CRITICAL, "no verdict"),))
    assert problems_from_results([bare]) == []
    said = Finding("ANYTHING", Status.CRITICAL, "x", action="restart_cluster")
    (problem,) = problems_from_results([CheckResult("c", Status.CRITICAL, "x", (said,))])
    assert (problem.action, problem.code) == ("restart_cluster", "ANYTHING")


def test_only_critical_findings_count_and_one_problem_per_check_and_action(tmp_path: Path) -> None:
    xids = xid_result(tmp_path, 79, 13)
    assert {f.code: f.status for f in xids.findings} == {"XID_79": Status.CRITICAL, "XID_13": Status.WARNING}
    results = [
        result("vllm", ("VLLM_SATURATED", Status.WARNING), ("VLLM_DEAD", Status.WARNING)),
        result("ray", ("RAY_NODE_DEAD", Status.CRITICAL), ("RAY_GPUS_MISSING", Status.CRITICAL)),
        xids,
    ]
    problems = problems_from_results(results)
    assert [(p.key, p.action) for p in problems] == [
        ("check:ray:restart_cluster", "restart_cluster"),
        ("check:xid:page", "page"),
    ]
    assert problems[0].reason.startswith("RAY_NODE_DEAD") and problems[1].reason.startswith("XID_79")


def test_a_warning_asks_for_nothing() -> None:
    for code in ("VLLM_DEAD", "RAY_NODE_DEAD", "IB_PORT_DOWN", "KV_CACHE_HIGH"):
        (finding,) = result("c", (code, Status.WARNING)).findings
        assert (finding.action, finding.cure.value) == ("none", "n/a"), code


def test_alerts_for_this_node_with_an_action_only() -> None:
    labels = {"alertname": "DgxdoctorVllmDown", "node": "dgx-a", "dgxdoctor_action": "restart_vllm"}
    problem = problem_from_alert(labels, "dgx-a", 100.0)
    assert problem is not None and problem.action == "restart_vllm" and problem.since == 100.0
    assert problem_from_alert(labels, "dgx-b", None) is None
    assert problem_from_alert({**labels, "dgxdoctor_action": "reboot"}, "dgx-a", None) is None
    assert problem_from_alert({"alertname": "X", "node": "dgx-a"}, "dgx-a", None) is None


def test_ladder_climbs_within_its_window_and_stops_at_page() -> None:
    assert escalate("restart_vllm", [], 1000.0, 3600) == "restart_vllm"
    assert escalate("restart_vllm", [Attempt("restart_vllm", 900.0)], 1000.0, 3600) == "restart_cluster"
    tried = [Attempt("restart_vllm", 900.0), Attempt("restart_cluster", 950.0)]
    assert escalate("restart_vllm", tried, 1000.0, 3600) == "page"
    assert escalate("restart_vllm", [Attempt("restart_vllm", 0.0)], 5000.0, 3600) == "restart_vllm"  # long ago
    assert escalate("restart_cluster", [Attempt("page", 990.0)], 1000.0, 3600) == "page"

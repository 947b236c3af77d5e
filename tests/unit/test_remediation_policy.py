"""Policy: which finding asks for which action, alerts for this node only, and the ladder."""

from __future__ import annotations

from dgxdoctor.remediation.policy import (
    Attempt,
    action_for_code,
    escalate,
    problem_from_alert,
    problems_from_results,
)
from dgxdoctor.result import CheckResult, Finding, Status


def result(check: str, *findings: tuple[str, Status]) -> CheckResult:
    found = tuple(Finding(code, status, f"{code} seen") for code, status in findings)
    return CheckResult(check, Status.worst(f.status for f in found), "x", found)


def test_codes_map_to_actions() -> None:
    assert action_for_code("VLLM_DEAD") == "restart_vllm"
    assert action_for_code("ENGINE_HUNG") == "restart_vllm"
    assert action_for_code("RAY_NODE_DEAD") == "restart_cluster"
    assert action_for_code("NCCL_TIMEOUT") == "restart_cluster"
    assert action_for_code("IB_PORT_DOWN") == "page"
    assert action_for_code("XID_79", "RESTART_BM") == "page"
    assert action_for_code("XID_13", "RESTART_APP") is None
    assert action_for_code("KV_CACHE_HIGH") is None  # scale out or lower concurrency: no restart cures it


def test_only_critical_findings_count_and_one_problem_per_check_and_action() -> None:
    results = [
        result("vllm", ("VLLM_SATURATED", Status.WARNING)),
        result("ray", ("RAY_NODE_DEAD", Status.CRITICAL), ("RAY_GPUS_MISSING", Status.CRITICAL)),
        result("xid", ("XID_79", Status.CRITICAL), ("XID_13", Status.CRITICAL)),
    ]
    problems = problems_from_results(results, {79: "RESTART_BM", 13: "RESTART_APP"})
    assert [(p.key, p.action) for p in problems] == [
        ("check:ray:restart_cluster", "restart_cluster"),
        ("check:xid:page", "page"),
    ]
    assert problems[0].reason.startswith("RAY_NODE_DEAD")


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

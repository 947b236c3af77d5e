"""The shipped alert rules: generated from the code's tables, valid for ``promtool check rules``, and each firing
(or staying silent) as intended on synthetic series under ``promtool test rules`` with its labels and annotations.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_cli
from dgxdoctor.alerts.alert_rules import all_alerts, render

pytestmark = pytest.mark.integration

ALERTS_FILE = REPO / "src" / "dgxdoctor" / "alerts" / "dgxdoctor-alerts.rules.yml"
ALERTS = {a.name: a for _, group in all_alerts() for a in group}
_LABEL = re.compile(r"\{\{ \$labels\.(\w+) \}\}")
_VALUE = re.compile(r"\{\{ \$value( \| humanizePercentage)? \}\}")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{lab}}}", "values": values}


def expect(name: str, value: str = "", **labels: str) -> dict[str, Any]:
    """The alert ``name`` with ``labels`` (of the series, plus the rule's own) and its rendered annotations."""
    alert = ALERTS[name]

    def fill(text: str) -> str:
        return _VALUE.sub(value, _LABEL.sub(lambda m: labels.get(m.group(1), ""), text))

    return {
        "exp_labels": {**labels, "severity": alert.severity, **alert.labels},
        "exp_annotations": {"summary": fill(alert.summary), "description": fill(alert.description)},
    }


def run_tests(tmp_path: Path, rules: Path, inputs: list[dict[str, str]], cases: list[dict[str, Any]]) -> None:
    doc = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": inputs, "alert_rule_test": cases}],
    }
    path = tmp_path / "alert_test.yml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``dgxdoctor rules`` prints: the recording and the alert rules in one file."""
    done = run_cli("rules")
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("rules") / "dgxdoctor.rules.yml"
    path.write_text(done.stdout)
    return path


def test_shipped_alert_rules_are_generated() -> None:
    assert ALERTS_FILE.read_text() == render(), "regenerate: python -m dgxdoctor.alerts.alert_rules > " + str(
        ALERTS_FILE.relative_to(REPO)
    )


def test_printed_rules_are_valid(rules: Path) -> None:
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DgxdoctorVllmDown" in rules.read_text() and "deviation_ratio" in rules.read_text()


def test_actionable_alerts_carry_action_and_node(tmp_path: Path, rules: Path) -> None:
    """A dead vLLM pages with dgxdoctor_action=restart_vllm after 30 s; a saturated one (warning) never does."""
    vllm = {"node": "dgx-a", "check": "vllm", "job": "dgxdoctor"}
    ray = {"node": "dgx-a", "check": "ray", "job": "dgxdoctor", "code": "RAY_GPUS_MISSING", "status": "critical"}
    inputs = [
        series("dgxdoctor_check_findings_by_code", "0 1x10", **vllm, code="VLLM_DEAD", status="critical"),
        series("dgxdoctor_check_findings_by_code", "1x10", **{**vllm, "node": "dgx-b"}, code="VLLM_SATURATED",
               status="warning"),
        series("dgxdoctor_check_findings_by_code", "1x10", **ray),
        series("dgxdoctor_logs_signature_matches_total", "0 0 1 1 1", node="dgx-a", code="NCCL_TIMEOUT"),
    ]  # fmt: skip
    dead = {**vllm, "code": "VLLM_DEAD", "status": "critical"}
    cases = [
        {"eval_time": "30s", "alertname": "DgxdoctorVllmDown", "exp_alerts": []},  # held for 30 s first
        {"eval_time": "1m", "alertname": "DgxdoctorVllmDown", "exp_alerts": [expect("DgxdoctorVllmDown", **dead)]},
        {"eval_time": "1m", "alertname": "DgxdoctorRayClusterDegraded",
         "exp_alerts": [expect("DgxdoctorRayClusterDegraded", **ray)]},
        {"eval_time": "45s", "alertname": "DgxdoctorNcclFailure",
         "exp_alerts": [expect("DgxdoctorNcclFailure", node="dgx-a", code="NCCL_TIMEOUT")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)
    for name in ("DgxdoctorVllmDown", "DgxdoctorRayClusterDegraded", "DgxdoctorNcclFailure"):
        assert ALERTS[name].labels["dgxdoctor_action"] in ("restart_vllm", "restart_cluster")


def test_a_lost_gcs_in_the_logs_asks_for_a_cluster_restart(tmp_path: Path, rules: Path) -> None:
    """RAY_GCS_UNREACHABLE is a logs signature (judge.consequence: the logs check, restart_cluster): its match counter
    fires the logs' restart alert. It was in the ray check's alert, which never sees that code."""
    inputs = [series("dgxdoctor_logs_signature_matches_total", "0 0 1 1 1", node="dgx-a", code="RAY_GCS_UNREACHABLE")]
    cases = [{"eval_time": "45s", "alertname": "DgxdoctorNcclFailure",
              "exp_alerts": [expect("DgxdoctorNcclFailure", node="dgx-a", code="RAY_GCS_UNREACHABLE")]}]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_xids_by_resolution_class(tmp_path: Path, rules: Path) -> None:
    """XID 79 (fallen off the bus) asks for a reboot, XID 64 for a GPU reset, XID 13 is the application's."""
    now = "0+15x100"  # the last-seen timestamp follows the clock: the XID keeps happening
    gpu = {"node": "dgx-a", "pci_bus_id": "00000000:19:00.0"}
    check = {"node": "dgx-a", "check": "xid"}
    inputs = [
        series("dgxdoctor_xid_last_seen_timestamp_seconds", now, **gpu, xid="79"),
        series("dgxdoctor_xid_last_seen_timestamp_seconds", now, **gpu, xid="64"),
        series("dgxdoctor_xid_last_seen_timestamp_seconds", now, **gpu, xid="13"),
        series("dgxdoctor_check_findings_by_code", "1x100", **check, code="XID_79", status="critical"),
        series("dgxdoctor_check_findings_by_code", "1x100", **check, code="XID_64", status="critical"),
        series("dgxdoctor_check_findings_by_code", "1x100", **check, code="XID_13", status="warning"),
    ]
    cases = [
        {"eval_time": "20m", "alertname": "DgxdoctorXidRebootRequired",
         "exp_alerts": [expect("DgxdoctorXidRebootRequired", **gpu, xid="79")]},
        {"eval_time": "20m", "alertname": "DgxdoctorXidGpuResetRequired",
         "exp_alerts": [expect("DgxdoctorXidGpuResetRequired", **gpu, xid="64")]},
        {"eval_time": "20m", "alertname": "DgxdoctorXidApplicationError",
         "exp_alerts": [expect("DgxdoctorXidApplicationError", **gpu, xid="13")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_xid_alerts_hold_until_the_check_clears_them(tmp_path: Path, rules: Path) -> None:
    """XID 48 seen once 20 minutes ago still needs its reset (the check says so until the reboot): the alert holds;
    a non-fatal NVLink XID 145 the check calls a warning does not fire the critical NVLink alert; an XID the
    check cleared (its clear_after_s) stops firing with it."""
    gpu = {"node": "dgx-a", "pci_bus_id": "00000000:19:00.0"}
    check = {"node": "dgx-a", "check": "xid"}
    inputs = [
        series("dgxdoctor_xid_last_seen_timestamp_seconds", "0x100", **gpu, xid="48"),  # 20 minutes ago at 20m
        series("dgxdoctor_check_findings_by_code", "1x100", **check, code="XID_48", status="critical"),
        series("dgxdoctor_xid_last_seen_timestamp_seconds", "0x100", **gpu, xid="145"),
        series("dgxdoctor_check_findings_by_code", "1x100", **check, code="XID_145", status="warning"),
        series("dgxdoctor_xid_last_seen_timestamp_seconds", "0x100", **gpu, xid="79"),
        series("dgxdoctor_check_findings_by_code", "1x40 _x60", **check, code="XID_79", status="critical"),
    ]
    cases = [
        {"eval_time": "20m", "alertname": "DgxdoctorXidGpuResetRequired",
         "exp_alerts": [expect("DgxdoctorXidGpuResetRequired", **gpu, xid="48")]},
        {"eval_time": "20m", "alertname": "DgxdoctorXidNvlinkError", "exp_alerts": []},
        {"eval_time": "5m", "alertname": "DgxdoctorXidRebootRequired",
         "exp_alerts": [expect("DgxdoctorXidRebootRequired", **gpu, xid="79")]},
        {"eval_time": "20m", "alertname": "DgxdoctorXidRebootRequired", "exp_alerts": []},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def info(node: str, group: str) -> dict[str, str]:
    return series("dgxdoctor_node_info", "1x60", node=node, group=group)


def test_asymmetric_node_within_its_serving_group(tmp_path: Path, rules: Path) -> None:
    """Two nodes: dgx-b's GPUs at 0.1 while dgx-a's are at 0.9 is 89% off the best node; three nodes with one odd
    one name that one alone; a node idle in another group is compared with its own group only."""
    util = "dgxdoctor_gpu_utilization_ratio"
    two = [info("dgx-a", "g"), info("dgx-b", "g"),
           series(util, "0.9x60", node="dgx-a", gpu="0"), series(util, "0.1x60", node="dgx-b", gpu="0")]  # fmt: skip
    name = "DgxdoctorNodeAsymmetricGpuUtilization"
    cases = [
        {"eval_time": "5m", "alertname": name, "exp_alerts": []},
        {"eval_time": "12m", "alertname": name, "exp_alerts": [expect(name, "88.89%", node="dgx-b", group="g")]},
    ]
    run_tests(tmp_path, rules, two, cases)
    three = [series(util, f"{u}x60", node=n, gpu="0") for n, u in (("n1", 0.8), ("n2", 0.8), ("n3", 0.2), ("m1", 0))]
    three += [info("n1", "c3"), info("n2", "c3"), info("n3", "c3"), info("m1", "other")]
    cases = [{"eval_time": "12m", "alertname": name, "exp_alerts": [expect(name, "75%", node="n3", group="c3")]}]
    run_tests(tmp_path, rules, three, cases)


def test_vllm_kv_cache_sustained_not_a_spike(tmp_path: Path, rules: Path) -> None:
    inputs = [
        series("dgxdoctor_vllm_kv_cache_usage_ratio", "0.95x80", node="dgx-a", model="glm"),
        series("dgxdoctor_vllm_kv_cache_usage_ratio", "0.2x20 1 0.2x60", node="dgx-b", model="glm"),
    ]
    cases = [
        {"eval_time": "17m", "alertname": "DgxdoctorVllmKvCacheHigh",
         "exp_alerts": [expect("DgxdoctorVllmKvCacheHigh", node="dgx-a", model="glm")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_vllm_engine_without_progress_warns_before_the_finding(tmp_path: Path, rules: Path) -> None:
    """The stall gauge crosses half of stall_s on dgx-a (a hang building up); dgx-b's short stalls stay quiet."""
    inputs = [
        series("dgxdoctor_vllm_seconds_since_progress", "0 0 2 6 8 10", node="dgx-a"),
        series("dgxdoctor_vllm_seconds_since_progress", "0 2 0 2 0 4", node="dgx-b"),
    ]
    cases = [
        {"eval_time": "45s", "alertname": "DgxdoctorVllmEngineNoProgress", "exp_alerts": []},
        {"eval_time": "60s", "alertname": "DgxdoctorVllmEngineNoProgress",
         "exp_alerts": [expect("DgxdoctorVllmEngineNoProgress", "8", node="dgx-a")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_the_node_whose_gpus_went_idle_during_a_stall_is_named(tmp_path: Path, rules: Path) -> None:
    """A TP rank stopped on dgx-b: dgx-a's GPUs spin in the collective, dgx-b's are idle; the head's engine stalls."""
    inputs = [
        series("dgxdoctor_vllm_seconds_since_progress", "0 0 0 10 16 20", node="dgx-a"),
        series("dgxdoctor_gpu_utilization_ratio", "0.7 0.7 1 1 1 1", node="dgx-a", gpu="0"),
        series("dgxdoctor_gpu_utilization_ratio", "0.7 0.7 0 0 0 0", node="dgx-b", gpu="0"),
    ]
    cases = [
        {"eval_time": "15s", "alertname": "DgxdoctorTpRankStopped", "exp_alerts": []},  # busy, no stall
        {"eval_time": "60s", "alertname": "DgxdoctorTpRankStopped",
         "exp_alerts": [expect("DgxdoctorTpRankStopped", node="dgx-b")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_a_rank_nccl_ras_finds_unresponsive(tmp_path: Path, rules: Path) -> None:
    """The ras check's problem series (value: first seen) fires at once; a rank only behind does not."""
    stuck = {"node": "dgx-a", "kind": "unresponsive", "rank": "11", "host": "10.0.0.2", "pid": "48213", "gpu": "3",
             "nvml_gpu": "3"}  # fmt: skip
    behind = {**stuck, "kind": "behind", "rank": "4", "pid": "51007"}
    inputs = [
        series("dgxdoctor_ras_rank_problem_since_timestamp_seconds", "_ _ 1764590590x3", **stuck),
        series("dgxdoctor_ras_rank_problem_since_timestamp_seconds", "1764590500x5", **behind),
    ]
    cases = [
        {"eval_time": "15s", "alertname": "DgxdoctorNcclRankUnresponsive", "exp_alerts": []},
        {"eval_time": "45s", "alertname": "DgxdoctorNcclRankUnresponsive",
         "exp_alerts": [expect("DgxdoctorNcclRankUnresponsive", **stuck)]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_a_gpu_spinning_without_memory_traffic_is_waiting_on_a_peer(tmp_path: Path, rules: Path) -> None:
    """The H200 recording: the waiting GPU reads 100 % utilization and 0 % memory; decode reads memory hard."""
    gpu = {"node": "dgx-a", "gpu": "0"}
    decoding = {"node": "dgx-b", "gpu": "0"}
    inputs = [
        series("dgxdoctor_gpu_utilization_ratio", "0.85 1 1 1 1 1", **gpu),
        series("dgxdoctor_gpu_memory_utilization_ratio", "0.25 0 0 0 0 0", **gpu),
        series("dgxdoctor_gpu_utilization_ratio", "1x5", **decoding),
        series("dgxdoctor_gpu_memory_utilization_ratio", "0.6x5", **decoding),
    ]
    cases = [
        {"eval_time": "30s", "alertname": "DgxdoctorGpuWaitingOnPeer", "exp_alerts": []},
        {"eval_time": "60s", "alertname": "DgxdoctorGpuWaitingOnPeer",
         "exp_alerts": [expect("DgxdoctorGpuWaitingOnPeer", **gpu)]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_version_drift_compares_the_nodes_of_one_serving_group(tmp_path: Path, rules: Path) -> None:
    """Two separate two-node deployments on different vLLM versions are no drift; within one, a difference is."""
    fact = "dgxdoctor_node_fact_info"
    inputs = [
        series(fact, "1x40", node="dgx-a", key="vllm_version", value="0.32.0"),
        series(fact, "1x40", node="dgx-b", key="vllm_version", value="0.32.0"),
        series(fact, "1x40", node="dgx-c", key="vllm_version", value="0.30.1"),
        series(fact, "1x40", node="dgx-d", key="vllm_version", value="0.30.1"),
        series(fact, "1x40", node="dgx-c", key="driver_version", value="580.159.04"),
        series(fact, "1x40", node="dgx-d", key="driver_version", value="570.86.15"),
        info("dgx-a", "chat"),
        info("dgx-b", "chat"),
        info("dgx-c", "code"),
        info("dgx-d", "code"),
    ]
    cases = [
        {"eval_time": "6m", "alertname": "DgxdoctorVersionDrift",
         "exp_alerts": [expect("DgxdoctorVersionDrift", group="code", key="driver_version")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_every_alert_name_is_camel_case() -> None:
    assert [name for name in ALERTS if not re.fullmatch(r"Dgxdoctor(?:[A-Z][a-z0-9]*)+", name)] == []


def test_fleet_alerts(tmp_path: Path, rules: Path) -> None:
    """Version drift between nodes, a peer unreachable, a port down, probe timeouts, the breaker open."""
    fact = "dgxdoctor_node_fact_info"
    inputs = [
        series(fact, "1x40", node="dgx-a", key="driver_version", value="580.159.04"),
        series(fact, "1x40", node="dgx-b", key="driver_version", value="570.86.15"),
        series(fact, "1x40", node="dgx-a", key="kernel_release", value="6.1.0"),
        series(fact, "1x40", node="dgx-b", key="kernel_release", value="6.1.0"),
        series("dgxdoctor_peer_up", "0x40", node="dgx-a", peer="http://dgx-b:9835"),
        series("dgxdoctor_ib_port_up", "0x40", node="dgx-a", device="mlx5_0", port="1"),
        series("dgxdoctor_check_timeouts_total", "0 0 1x40", node="dgx-a", check="gpu"),
        series("dgxdoctor_remediation_breaker_open", "0 1x40", node="dgx-a"),
    ]
    cases = [
        {"eval_time": "6m", "alertname": "DgxdoctorVersionDrift",
         "exp_alerts": [expect("DgxdoctorVersionDrift", key="driver_version")]},
        {"eval_time": "3m", "alertname": "DgxdoctorPeerDown",
         "exp_alerts": [expect("DgxdoctorPeerDown", node="dgx-a", peer="http://dgx-b:9835")]},
        {"eval_time": "3m", "alertname": "DgxdoctorIbPortDown",
         "exp_alerts": [expect("DgxdoctorIbPortDown", node="dgx-a", device="mlx5_0", port="1")]},
        {"eval_time": "1m", "alertname": "DgxdoctorProbeTimeouts",
         "exp_alerts": [expect("DgxdoctorProbeTimeouts", node="dgx-a", check="gpu")]},
        {"eval_time": "1m", "alertname": "DgxdoctorRemediationBreakerOpen",
         "exp_alerts": [expect("DgxdoctorRemediationBreakerOpen", node="dgx-a")]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_critical_kernel_faults_and_the_fabric_manager(tmp_path: Path, rules: Path) -> None:
    """A serving process OOM-killed and a rail's link down page; a java OOM kill (warning) does not; the fabric
    manager after a minute."""
    findings = "dgxdoctor_check_findings_by_code"
    node = {"node": "dgx-a"}
    inputs = [
        series(findings, "1x20", **node, check="xid", code="KERNEL_OOM_KILL", status="critical"),
        series(findings, "1x20", **node, check="xid", code="KERNEL_LINK_DOWN", status="critical"),
        series(findings, "1x20", node="dgx-b", check="xid", code="KERNEL_OOM_KILL", status="warning"),
        series(findings, "1x20", **node, check="driver_stack", code="DRIVER_FABRIC_MANAGER_DOWN", status="critical"),
    ]
    labels = {**node, "check": "xid", "status": "critical"}
    fm = {**node, "check": "driver_stack", "code": "DRIVER_FABRIC_MANAGER_DOWN", "status": "critical"}
    cases = [
        {"eval_time": "1m", "alertname": "DgxdoctorKernelOomKill",
         "exp_alerts": [expect("DgxdoctorKernelOomKill", **labels, code="KERNEL_OOM_KILL")]},
        {"eval_time": "1m", "alertname": "DgxdoctorKernelLinkDown",
         "exp_alerts": [expect("DgxdoctorKernelLinkDown", **labels, code="KERNEL_LINK_DOWN")]},
        {"eval_time": "30s", "alertname": "DgxdoctorFabricManagerDown", "exp_alerts": []},
        {"eval_time": "2m", "alertname": "DgxdoctorFabricManagerDown",
         "exp_alerts": [expect("DgxdoctorFabricManagerDown", **fm)]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)


def test_a_down_agent_is_paged_with_its_node_and_group(tmp_path: Path, rules: Path) -> None:
    """The agent stops answering: its series vanish, but the node and group it last exported on that instance name
    the page (and group it at Alertmanager); an instance that never exported them still pages, by instance."""
    inputs = [
        series("up", "1 1 0x20", job="dgxdoctor", instance="10.0.0.2:9835"),
        series(
            "dgxdoctor_node_info", "1 1 _x20", job="dgxdoctor", instance="10.0.0.2:9835", node="dgx-b", group="glm-a"
        ),
        series("up", "0x22", job="dgxdoctor", instance="10.0.0.9:9835"),
    ]
    cases = [
        {"eval_time": "4m", "alertname": "DgxdoctorAgentDown", "exp_alerts": [
            expect("DgxdoctorAgentDown", job="dgxdoctor", instance="10.0.0.2:9835", node="dgx-b", group="glm-a"),
            expect("DgxdoctorAgentDown", job="dgxdoctor", instance="10.0.0.9:9835"),
        ]},
    ]  # fmt: skip
    run_tests(tmp_path, rules, inputs, cases)

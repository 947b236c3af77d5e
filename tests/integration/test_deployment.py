"""The documented deployment as a test, on the multi-node harness (tests/harness, docs/testing.md).

Two nodes, each in its own network and PID namespace, laid out as the README installs dgxdoctor (config.toml and
token under an /etc/dgxdoctor of its own, every check on, observe mode: no [remediation] table; the daemon started
as systemd/dgxdoctor.service starts it), a private kernel log, a fake systemctl and a journal written through
systemd-journal-remote; vLLM and Ray started from the shipped units (systemd/vllm.service, ray-head.service,
ray-worker.service, the mp units) with stand-in programs, the README's nccl.env installed; a real Prometheus
loading `dgxdoctor rules` that scrapes both agents before the first fault, and a real Alertmanager routing to the
head's /alertmanager with the token (docs/remediation.md).

- ``test_first_fault_of_each_acting_alert``: the whole deployment healthy (no check WARNING, CRITICAL or UNKNOWN
  on either node, no alert pending), then the first fault of each alert that carries ``dgxdoctor_action``, the
  three within a second, followed layer by layer: the check's finding, the metric, the alert firing in Prometheus, its
  arrival at the webhook, the decision in the audit. The hardware comes through its seams: the healthy InfiniBand
  sysfs tree, the GPUs of the H200 capture through NVML's (tests/faults/agent.py runs the daemon with it).
- ``test_mp_executor_layout``: vLLM's multiprocessing executor across the nodes (the head's unit runs ``--nnodes 2
  --node-rank 0``, the worker's ``--headless``): no WARNING or CRITICAL on either node for the serving checks past
  the start grace; the worker's vLLM stopped, the head names the worker.

About 60 s together on two busy cores (the two ``for: 30s`` alerts dominate).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from harness import Cluster, Node, wait_for
from journalwriter import journal_remote
from sysfstree import build_sysfs_tree

pytestmark = pytest.mark.integration

# torch's NCCL watchdog in a worker (tests/fixtures/logs/nccl_timeout.log).
NCCL_TIMEOUT = (
    "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, "
    "Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
)
GRACE_S = 3.0
AGENT = Path(__file__).resolve().parents[1] / "faults" / "agent.py"  # `dgxdoctor run` with the NVML capture


def not_healthy(node: Node, checks: tuple[str, ...] | None = None) -> dict[str, str]:
    """Checks (of ``checks``, else every enabled one) WARNING, CRITICAL or UNKNOWN on ``node`` (or not run yet):
    check -> summary."""
    results = node.checks()
    wanted = checks or tuple(results) or ("any",)
    return {c: results.get(c, {}).get("summary", "not run yet") for c in wanted
            if results.get(c, {}).get("status", "missing") not in ("ok", "skipped")}  # fmt: skip


def finding(node: Node, check: str, code: str) -> dict[str, Any] | None:
    return next((f for f in node.findings(check) if f["code"] == code), None)


def decisions(node: Node, problem: str) -> list[dict[str, Any]]:
    return [r for r in node.audit() if r["event"] == "decision" and r["problem"] == problem]


# -- the documented deployment ----------------------------------------------------------------------------------

# Each alert with dgxdoctor_action (src/dgxdoctor/alerts/dgxdoctor-alerts.rules.yml): the check, the finding's
# code, the series that carries it, and the action.
ACTING_ALERTS = {
    "DgxdoctorVllmDown": ("vllm", "VLLM_DEAD", "restart_vllm"),
    "DgxdoctorRayClusterDegraded": ("ray", "RAY_NODE_DEAD", "restart_cluster"),
    "DgxdoctorNcclFailure": ("logs", "NCCL_TIMEOUT", "restart_cluster"),
}


def site_config(node: Node) -> dict[str, dict[str, Any]]:
    """What the site sets beside the README's config: the node's hardware as the harness gives it (the healthy
    InfiniBand tree, the NVML capture's 2 GPUs), nccl.env installed under ROOT, the serving checks every second."""
    sysfs = build_sysfs_tree(node.root / "sys", "dgx_ndr_healthy.txt")
    node.install_nccl_env(NCCL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0", VLLM_HOST_IP=node.ip)
    every_second = {"interval_s": 1.0}
    return {
        "paths": {"sysfs_root": str(sysfs), "host_root": str(node.root)},
        "checks.gpu": {"expected_count": 2},
        "checks.nccl_env": {"env_file": str(node.root / "etc" / "profile.d" / "nccl.sh")},
        # No NCCL runs in the stand-in vLLM: no RAS to ask (test_ras_*.py asks a real one and recordings).
        "checks.ras": {"enabled": False},
        "checks.vllm": {**every_second, "startup_grace_s": GRACE_S},
        "checks.ray": every_second,
        "checks.logs": every_second,
    }


def test_first_fault_of_each_acting_alert() -> None:
    journal_remote()  # skips naming the package when it is missing
    with Cluster({"dgx-a": "head", "dgx-b": "worker"}, monitor=True) as cluster:
        head, worker = cluster["dgx-a"], cluster["dgx-b"]
        for node in (head, worker):
            node.configure(extra=site_config(node))  # every check on, as the README's install leaves them
        cluster.start_unit(head, "ray-head.service")
        vllm = cluster.start_unit(head, "vllm.service")
        cluster.start_unit(worker, "ray-worker.service")
        # The agents with their GPUs through NVML's seam (tests/faults/agent.py: the H200 capture), else as the unit.
        cluster.start_daemons([sys.executable, str(AGENT)], {"PYTHONPATH": f"{AGENT.parents[1]}:{REPO / 'src'}"})
        monitoring = cluster.monitoring
        assert monitoring is not None
        time.sleep(GRACE_S)
        wait_for("both nodes healthy", lambda: not not_healthy(head) and not not_healthy(worker), 60, head, worker)
        # Before the first fault, Prometheus holds the counter DgxdoctorNcclFailure's increase() reads, at 0: the
        # first event moves it (the findings' gauges need no baseline: `> 0` for 30 s fires on a new series).
        series = 'dgxdoctor_logs_signature_matches_total{node="dgx-a",code="NCCL_TIMEOUT"}'
        wait_for(f"{series} at 0 in Prometheus", lambda: monitoring.value(series) == 0.0, 30, head)
        assert not [r for r in head.audit() if r["event"] == "decision"], head.audit()
        assert monitoring.alerts() == []  # nothing pending or firing on the healthy deployment
        # The units' output is in their journal, as journalctl shows it to an operator.
        shown = subprocess.run(["journalctl", f"--directory={head.journal}", "-u", "vllm.service", "-o", "cat"],
                               capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
        assert "vLLM stand-in: /models/glm, node rank 0 of 1, API server on http://0.0.0.0:8000" in shown, shown

        # The first fault of each: torch's NCCL watchdog line in vLLM's output (so in vllm.service's journal), then
        # vLLM's process dies; the head's dashboard reports the worker node DEAD (the capture of a real Ray head).
        cluster.say(head, "vllm.service", vllm, NCCL_TIMEOUT)
        vllm.signal(signal.SIGKILL)
        cluster.ray_scenario(head, "dead")
        t0 = time.monotonic()

        # 1. the check's finding, 2. the metric the alert reads
        for check, code, _ in ACTING_ALERTS.values():
            found = wait_for(f"{code} from the {check} check", lambda c=check, k=code: finding(head, c, k), 30, head)
            assert found["status"] == "critical", found
        assert finding(head, "logs", "NCCL_TIMEOUT")["subject"] == "journal:vllm.service"  # type: ignore[index]
        for check, code in (("vllm", "VLLM_DEAD"), ("ray", "RAY_NODE_DEAD")):
            assert head.sample("dgxdoctor_check_findings_by_code", check=check, code=code, status="critical") == 1.0
        assert head.sample("dgxdoctor_logs_signature_matches_total", code="NCCL_TIMEOUT") == 1.0

        for alert, (_, _, action) in ACTING_ALERTS.items():
            # 3. firing in Prometheus, for the head, with its action
            (firing, *_) = wait_for(f"{alert} firing in Prometheus", lambda a=alert: monitoring.firing(a), 90, head)
            assert (firing["labels"]["node"], firing["labels"]["dgxdoctor_action"]) == ("dgx-a", action), firing
        # 4. delivered to the head's webhook: a decision whose source is "alert" (the only way to get one), 5. decided
        # on in observe mode, act mode's dry run: what act mode would answer (a hold while the condition has not held
        # hold_s or vLLM is in its start grace; a refusal, one action at a time or a cooldown; "would X" where it would
        # run X).
        # One answer may cover several alerts of one action (a dry-run restart_cluster answers both cluster alerts).
        problems = {f"alert:{alert}:{action}" for alert, (_, _, action) in ACTING_ALERTS.items()}
        decided = wait_for("a decision on a delivered alert", lambda: [
            r for r in head.audit() if r["event"] == "decision" and r.get("source") == "alert"
            and r["problem"] in problems], 60, head)  # fmt: skip
        for record in decided:
            assert record["mode"] == "observe" and record["verdict"] in ("hold", "refuse", "observe"), record
            if record["verdict"] == "observe":
                assert f"would {record['action']}" in record["reason"], record
        print(f"decided on {sorted({r['problem'] for r in decided})} {time.monotonic() - t0:.1f} s after")
        # Alertmanager's webhook notifications went out and all went through (a wrong token would fail them).
        am = {s.name: s.value for f in text_string_to_metric_families(httpx.get(f"{monitoring.alertmanager_url}"
              "/metrics", timeout=5).text) for s in f.samples if s.labels.get("integration") == "webhook"}  # fmt: skip
        assert am["alertmanager_notifications_total"] >= 1 and am["alertmanager_notifications_failed_total"] == 0, am
        # Only the alerts of the faults fire: none of the other rules' (a healthy worker, the hardware, the agents).
        assert {a["labels"]["alertname"] for a in monitoring.alerts() if a["state"] == "firing"} == set(ACTING_ALERTS)
        # The checks decided too (source "check"), and observe mode ran nothing: the fake systemctl saw no call.
        assert {r["action"] for r in head.audit() if r["event"] == "decision" and r["source"] == "check"} >= {
            "restart_vllm", "restart_cluster"}  # fmt: skip
        assert not [r for r in head.audit() if r["event"] in ("action_started", "action")]
        assert head.systemctl_calls() == [] and worker.systemctl_calls() == []
        assert not [r for r in worker.audit() if r["event"] == "decision" and r["source"] == "alert"]


# -- vLLM's multiprocessing executor across the nodes -------------------------------------------------------------

SERVING = ("vllm", "vllm_executor", "ray", "peer_compare")


def test_mp_executor_layout() -> None:
    """The shipped vllm-head-mp.service and vllm-worker-mp.service (their HEAD_ADDR the site's), stand-ins."""
    with Cluster({"dgx-a": "head", "dgx-b": "worker"}) as cluster:
        head, worker = cluster["dgx-a"], cluster["dgx-b"]
        fast = {f"checks.{c}": {"interval_s": 1.0} for c in SERVING}
        fast["checks.vllm"].update({"startup_grace_s": GRACE_S, "canary": "never"})
        for node in (head, worker):
            node.install_nccl_env(VLLM_HOST_IP=node.ip)
            node.configure(extra=fast, only=SERVING, node={"executor": "mp"})
        cluster.start_unit(head, "vllm-head-mp.service", HEAD_ADDR=head.ip)
        headless = cluster.start_unit(worker, "vllm-worker-mp.service", HEAD_ADDR=head.ip)
        # Each node's /proc holds its own processes only: one `vllm serve` each, its own rank. Counted once each
        # printed its banner: until then a rank it is forking still carries its command line, not yet sleep's.
        for node, unit in ((head, "vllm-head-mp.service"), (worker, "vllm-worker-mp.service")):
            log = node.root / f"{unit}.log"
            wait_for(f"{unit} started", lambda p=log: p.exists() and "vLLM stand-in" in p.read_text(), 30, node)
        for node, rank in ((head, "0"), (worker, "1")):
            seen = node.ns.run(["pgrep", "-af", "vllm serve"]).stdout.splitlines()
            assert len(seen) == 1 and f"--node-rank {rank}" in seen[0], seen
            assert node.ns.run(["pgrep", "-f", "pytest"]).stdout == ""  # nor the test running them
        cluster.start_daemons()
        wait_for("both nodes healthy", lambda: not not_healthy(head, SERVING) and not not_healthy(worker, SERVING),
                 30, head, worker)  # fmt: skip
        # Healthy past the start grace: every run for a few seconds more, on both nodes, no WARNING or CRITICAL.
        until = time.monotonic() + GRACE_S + 3
        while time.monotonic() < until:
            for node in (head, worker):
                assert not not_healthy(node, SERVING), (node.name, not_healthy(node, SERVING))
            time.sleep(0.5)
        assert worker.checks()["vllm"]["status"] == "skipped"  # a headless worker serves no API, by design
        master = f"master {head.ip}:29501"
        assert f"{master}: this node is the head" in head.checks()["vllm_executor"]["summary"]
        assert f"{master}: this node is the headless worker" in worker.checks()["vllm_executor"]["summary"]
        assert worker.sample("dgxdoctor_vllm_mp_master_reachable", master=f"{head.ip}:29501") == 1.0

        headless.stop()  # systemctl stop vllm-worker-mp.service: the worker's vLLM is gone
        down = wait_for("PEER_MP_WORKER_DOWN at the head", lambda: finding(head, "peer_compare",
                        "PEER_MP_WORKER_DOWN"), 30, head, worker)  # fmt: skip
        assert down["status"] == "critical" and down["subject"] == "dgx-b", down
        assert finding(worker, "vllm_executor", "VLLM_MP_HEADLESS_MISSING") is not None

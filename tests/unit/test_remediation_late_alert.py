"""A late alert is no reason: its ``startsAt`` is when Prometheus first found it true, not when the evidence was seen.

``DgxdoctorNcclFailure`` reads ``increase(dgxdoctor_logs_signature_matches_total[5m])``: it describes a log line
for five minutes after it, and a Prometheus that evaluates late (a loaded host, its interval, Alertmanager's
``group_wait``) starts firing after the cluster restart that cured it. The deployed replay saw it restart a healthy
cluster during the next fault. Remediation corroborates an alert with this node's own check where the node reports
the alert's code itself (``policy.fresh_alert``); an alert it cannot check still acts on its ``startsAt``. An alert
held for old evidence is written to the audit once, with why.

Through the real path: Alertmanager's webhook body posted to the daemon's app (its token, its validation), the logs
check following a file and run by the check runner, the engine in act mode on an injected clock with a stand-in
command runner (the head of ``test_remediation_stale_evidence``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from test_remediation_stale_evidence import NCCL_TIMEOUT, Clock, Head, _records, live

from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.environment import Environment
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.remediation.policy import OLD_EVIDENCE
from dgxdoctor.validation import validate
from tokens import one_token
from webtest import TestClient, TestServer

TOKEN = "late-alert-token-0123456789abcdef"
NCCL_ALERT = "alert:DgxdoctorNcclFailure:restart_cluster"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def firing(name: str, action: str, starts: float, code: str | None, fingerprint: str) -> bytes:
    """Alertmanager's webhook body (version 4) for one firing alert of ``dgx-a``, as its notifier sends it."""
    labels = {"alertname": name, "dgxdoctor_action": action, "instance": "10.77.0.1:9835", "job": "dgxdoctor",
              "node": "dgx-a", "severity": "critical"}  # fmt: skip
    if code is not None:
        labels["code"] = code
    alert = {"status": "firing", "labels": labels, "annotations": {"summary": name}, "startsAt": rfc3339(starts),
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus:9090/graph",
             "fingerprint": fingerprint}  # fmt: skip
    return json.dumps({"receiver": "dgx", "status": "firing", "alerts": [alert], "groupLabels": {}, "commonLabels":
                       labels, "commonAnnotations": {}, "externalURL": "http://am:9093", "version": "4",
                       "groupKey": "{}", "truncatedAlerts": 0}).encode()  # fmt: skip


class Node:
    """The head with its logs check, and the daemon's app delivering webhook alerts to its remediation."""

    def __init__(self, root: Path, client: TestClient[Any, Any], head: Head, logs: LogsCheck, log: Path) -> None:
        self.root, self.client, self.head, self.logs, self.log = root, client, head, logs, log

    async def every(self) -> None:
        await self.head.check(self.logs)

    async def post(self, body: bytes) -> None:
        resp = await self.client.post("/alertmanager", data=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status == 200 and (await resp.json()) == {"accepted": 1, "ignored": 0}

    def watchdog(self, lines: list[str]) -> None:
        with self.log.open("a") as f:
            f.write("".join(f"{line}\n" for line in lines))

    def decided(self, key: str) -> list[dict[str, Any]]:
        return [r for r in _records(self.head.remediator) if r.get("event") == "decision" and r["problem"] == key]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    clock = Clock()
    head = Head(tmp_path, clock)
    log = tmp_path / "vllm.log"
    log.write_text("")
    (tmp_path / "logs-state").mkdir()
    settings = validate(LogsSettings, {"vllm_paths": [str(log)], "ray_paths": [], "journal_units": []})
    env = Environment(node="dgx-a", clock=clock, one_shot=False, state_dir=tmp_path / "logs-state")
    store = ResultStore("dgx-a")
    state = AppState(store, make_registry(store), lambda: {"healthy": True}, one_token(TOKEN), None,
                     alerts=head.remediator.accept_alerts)  # fmt: skip
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(state), host="127.0.0.1"))
    await client.start_server()
    n = Node(tmp_path, client, head, LogsCheck(settings, env), log)
    # An NCCL watchdog timeout: the logs check's finding restarts the cluster.
    await live(head, 10, n.every)
    n.watchdog(NCCL_TIMEOUT)
    await live(head, 60, n.every)
    assert head.actions() == ["restart_cluster"], _records(head.remediator)
    assert head.remediator.finished_at is not None
    yield n
    await client.close()


async def test_a_late_alert_about_the_cured_fault_restarts_nothing(node: Node) -> None:
    head, finished = node.head, node.head.remediator.finished_at
    assert finished is not None
    # Prometheus, evaluating late, starts firing 20 s after the restart ended, on the line from before it.
    await node.post(firing("DgxdoctorNcclFailure", "restart_cluster", finished + 20, "NCCL_TIMEOUT", "6a1f0c"))
    await live(head, 600, node.every)
    assert "NCCL_TIMEOUT" in [f.code for f in head.results["logs"].findings]  # the check still holds the old line
    assert head.actions() == ["restart_cluster"] and head.pages == [], head.pages
    # Never a reason: its evidence is from before the restart. Held, and the audit says why, once in ten minutes.
    held = node.decided(NCCL_ALERT)
    assert [(d["verdict"], d["reason"], d["source"]) for d in held] == [("hold", OLD_EVIDENCE, "alert")], held
    assert head.remediator.metrics()["alerts_held"] == 1  # dgxdoctor_remediation_alerts_held_total
    # The watchdog fires again after the restart: the same alert, still firing, is now what this node sees too.
    node.watchdog(NCCL_TIMEOUT[-1:])
    await live(head, 60, node.every)
    judged = node.decided(NCCL_ALERT)[1:]  # a reason again (since it started): the ladder's page, sent once for both
    assert [(d["action"], d["verdict"]) for d in judged][:1] == [("page", "page")], judged
    ended = "the ladder ended (restarts did not cure it): page an operator"
    assert [p.split(": ", 1)[1] for p in head.pages] == [ended]


@pytest.mark.parametrize("code", ["VLLM_DEAD", None])
async def test_a_fresh_alert_this_node_cannot_check_acts(node: Node, code: str | None) -> None:
    """No vllm check runs here (nor does a rule without a code name one): Prometheus's view is all there is, and
    an alert that starts after the last action ended is a reason; one that started before it is not."""
    head, finished = node.head, node.head.remediator.finished_at
    assert finished is not None and "vllm" not in head.results
    await node.post(firing("DgxdoctorVllmDown", "restart_vllm", finished - 5, code, "77b0e1"))
    await live(head, 60, node.every)
    assert head.actions() == ["restart_cluster"]
    assert [d["verdict"] for d in node.decided("alert:DgxdoctorVllmDown:restart_vllm")] == ["hold"]
    await node.post(firing("DgxdoctorVllmDown", "restart_vllm", finished + 20, code, "77b0e1"))
    await live(head, 60, node.every)
    assert head.actions() == ["restart_cluster", "restart_vllm"], _records(head.remediator)

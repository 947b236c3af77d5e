"""Remediation's two fleet gates with Prometheus as the cluster view (``[fleet] prometheus_url``): six real agents in
three serving groups on loopback ports, a real Prometheus scraping them (``harness.fleet.FleetRig``). No agent
fetches a peer's /state; the acting agents (a1 and c2, act mode, a fake ``systemctl`` first on their PATH recording
every call) read the fleet from Prometheus:

- **The fleet breaker**: b1 and c1 stopped (their targets down: two of three groups unhealthy) make a1 refuse an
  alert's vLLM restart, audited with the fleet's figures; nothing runs. Both back, the same alert restarts vLLM.
- **The hardware gate**: an XID 79 in the kernel log of c1 (c2's group peer) makes c2 refuse vLLM's restart with
  the hardware cause named (``PEER_HARDWARE_FAULT``, judged from Prometheus's code and subject) and page it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dgxdoctor.remediation.audit import AUDIT_FILE
from harness.fleet import BUS, TOKEN, Agent, FleetRig, fake_systemctl, wait, why_not_runnable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(why_not_runnable() is not None, reason=str(why_not_runnable())),
]

GROUPS = {"glm-a": ["a1", "a2"], "glm-b": ["b1", "b2"], "glm-c": ["c1", "c2"]}
ACTORS = ("a1", "c2")
# c2 holds an alert 10 s before acting: its asks of Prometheus (every second) see c1's XID within that time, however
# loaded the machine, and the code before this gate restarts once the hold is over.
REMEDIATION = (
    '[remediation]\nmode = "act"\nrole = "head"\nhold_s = {hold}\nvllm_start_grace_s = 0\nverify_timeout_s = 1\n'
    "drain = false\n"
)
HOLD_S = {"a1": 0, "c2": 10}


def alert(node: str, fingerprint: str) -> dict[str, Any]:
    labels = {"alertname": "DgxdoctorVllmDown", "node": node, "dgxdoctor_action": "restart_vllm"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"version": "4", "alerts": [{"status": "firing", "fingerprint": fingerprint, "startsAt": now,
                                        "labels": labels}]}  # fmt: skip


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRig]:
    root = tmp_path_factory.mktemp("gates")
    token = root / "peer.token"
    rig = FleetRig(
        root, GROUPS, compare_s=1.0,  # the fleet asked of Prometheus every second
        daemon_extra={a: f'alert_token_file = "{token}"\n' for a in ACTORS},
        agent_extra={a: REMEDIATION.format(hold=HOLD_S[a]) for a in ACTORS},
        agent_env={a: {"PATH": f"{fake_systemctl(root / a)}:/usr/bin:/bin"} for a in ACTORS},
    )  # fmt: skip
    with rig.running():
        yield rig


def agent(rig: FleetRig, name: str) -> Agent:
    return next(a for a in rig.agents if a.name == name)


def calls(a: Agent) -> list[str]:
    path = a.root / "systemctl.calls"
    return path.read_text().splitlines() if path.exists() else []


def audit(a: Agent) -> list[dict[str, Any]]:
    path = a.root / "state" / AUDIT_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def metric(a: Agent, name: str) -> float | None:
    text = httpx.get(f"{a.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def post_alert(a: Agent, fingerprint: str) -> None:
    answer = httpx.post(f"{a.url}/alertmanager", json=alert(a.name, fingerprint),
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)  # fmt: skip
    assert answer.status_code == 200, answer.text


def test_two_groups_down_in_prometheus_refuse_the_restart_until_they_recover(rig: FleetRig) -> None:
    a1 = agent(rig, "a1")
    assert metric(a1, "dgxdoctor_remediation_fleet_breaker_open") == 0.0
    for name in ("b1", "c1"):
        rig.stop_agent(agent(rig, name))
    wait(lambda: metric(a1, "dgxdoctor_remediation_fleet_breaker_open") == 1.0, 60, "a1's fleet breaker open",
         lambda: rig.log_tail(a1))  # fmt: skip
    post_alert(a1, "fleet-1")

    def refused() -> list[dict[str, Any]]:
        return [e for e in audit(a1) if e.get("verdict") == "refuse" and "fleet breaker" in e.get("reason", "")]

    wait(lambda: refused() != [], 30, "the restart refused by the fleet breaker", lambda: rig.log_tail(a1))
    reason = refused()[0]["reason"]
    assert "2 of 6 (33 %) nodes unhealthy: b1, c1" in reason, reason
    assert "2 of 3 (67 %) groups unhealthy: glm-b, glm-c" in reason, reason
    assert calls(a1) == []
    wait(lambda: [e for e in audit(a1) if e.get("event") == "page"] != [], 30, "the breaker's page")

    for name in ("b1", "c1"):
        rig.spawn(agent(rig, name))
    for name in ("b1", "c1"):
        rig.wait_healthy(agent(rig, name))
    wait(lambda: calls(a1) == ["restart vllm.service"], 60, "vLLM restarted once the fleet is back",
         lambda: rig.log_tail(a1))  # fmt: skip
    assert metric(a1, "dgxdoctor_remediation_fleet_breaker_open") == 0.0


def test_a_group_peers_xid_79_in_prometheus_refuses_the_restart_naming_it(rig: FleetRig) -> None:
    c1, c2 = agent(rig, "c1"), agent(rig, "c2")
    stopped = [a for a in rig.agents if a.proc is None]  # the first test stopped them and failed before the restart
    for a in stopped:
        rig.spawn(a)
    for a in stopped:
        rig.wait_healthy(a)
    wait(lambda: metric(c2, "dgxdoctor_remediation_fleet_breaker_open") == 0.0, 60, "c2's fleet breaker closed")
    rig.inject_critical(c1)
    wait(lambda: rig.query('dgxdoctor_finding_info{node="c1",code="XID_79"}') != [], 60, "the XID in Prometheus")
    post_alert(c2, "xid-1")

    def refused() -> list[dict[str, Any]]:
        return [e for e in audit(c2) if e.get("event") == "decision" and e.get("verdict") == "refuse"]

    wait(lambda: refused() != [], 30, "c2's restart refused", lambda: rig.log_tail(c2))
    reason = refused()[0]["reason"]
    assert reason.startswith("a restart cannot help: "), reason
    assert f"cause: XID 79 on {BUS} of c1 (PEER_HARDWARE_FAULT)" in reason, reason
    wait(lambda: [e for e in audit(c2) if e.get("event") == "page"] != [], 30, "the page")
    page = next(e for e in audit(c2) if e.get("event") == "page")
    assert f"XID 79 on {BUS} of c1" in page["reason"], page
    assert metric(c2, "dgxdoctor_remediation_fleet_breaker_open") == 0.0  # one node of six: not the breaker
    assert calls(c2) == []

"""``POST /alertmanager``: Alertmanager's real payloads accepted and queued, bad ones a 400 naming the problem,
no or a wrong token a 401, never a 5xx; ``POST /remediation/step`` needs the token and a known step."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES
from dgxdoctor.alerts.webhook import IncomingAlert, PayloadError, parse_payload
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.store import ResultStore
from tokens import one_token
from webtest import TestClient, TestServer

TOKEN = "0123456789abcdef-token"  # what the captured Alertmanager config sent
FIRING = (FIXTURES / "alertmanager" / "firing.json").read_bytes()
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BAD_START = {"status": "firing", "labels": {}, "fingerprint": "f", "startsAt": "soon"}


def test_real_payloads_parse() -> None:
    (alert,) = parse_payload(FIRING)
    assert alert.status == "firing" and alert.fingerprint == "e233e67d778488bc"
    assert alert.labels["dgxdoctor_action"] == "restart_vllm" and alert.labels["node"] == "dgx-a"
    assert alert.started is not None and alert.started > 1.7e9  # nanosecond fraction read
    (resolved,) = parse_payload((FIXTURES / "alertmanager" / "resolved.json").read_bytes())
    assert resolved.status == "resolved"


@pytest.mark.parametrize(
    ("starts_at", "seconds"),
    [
        ("2026-12-05T08:00:00Z", 0.0),
        ("2026-12-05T08:00:00.5Z", 0.5),
        ("2026-12-05T08:00:00.123Z", 0.123),
        ("2026-12-05T08:00:00.123456789Z", 0.123456),
        ("2026-12-05T09:00:00.25+01:00", 0.25),
    ],
)
def test_start_times_as_go_writes_them(starts_at: str, seconds: float) -> None:
    """Go's RFC 3339 has 0 to 9 fractional digits; Python 3.10's fromisoformat reads 3 or 6 of them."""
    alert = {"status": "firing", "labels": {}, "fingerprint": "f", "startsAt": starts_at}
    (got,) = parse_payload(json.dumps({"version": "4", "alerts": [alert]}).encode())
    assert got.started == pytest.approx(1_796_457_600 + seconds)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "Expected `object`, got `array`"),
        (json.dumps({"version": "3", "alerts": []}).encode(), r"'3' - at `\$.version`"),
        (json.dumps({"version": "4"}).encode(), "missing required field `alerts`"),
        (json.dumps({"version": "4", "alerts": [1]}).encode(), r"got `int` - at `\$.alerts\[0\]`"),
        (json.dumps({"version": "4", "alerts": [{"status": "firing"}]}).encode(), "missing required field `labels`"),
        (json.dumps({"version": "4", "alerts": [{"status": "odd", "labels": {}}]}).encode(), r"\.alerts\[0\]\.status"),
        (
            json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {"a": 1}}]}).encode(),
            r"Expected `str`, got `int` - at `\$\.alerts\[0\]\.labels",
        ),
        (b"[" * 100_000, "Expected `object`, got `array`"),
        (json.dumps({"version": "4", "alerts": [BAD_START]}).encode(), r"startsAt: expected an RFC 3339 time"),
    ],
)
def test_bad_payloads_name_the_problem(body: bytes, named: str) -> None:
    with pytest.raises(PayloadError, match=named):
        parse_payload(body)


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], list[list[IncomingAlert]], list[str]]]:
    store = ResultStore("dgx-a")
    got: list[list[IncomingAlert]] = []
    steps: list[str] = []

    def alerts(items: list[IncomingAlert]) -> tuple[int, int]:
        got.append(items)
        return len(items), 0

    async def step(doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        steps.append(doc["step"])
        return 200, {"ok": True, "detail": "exit 0"}

    state = AppState(
        store, make_registry(store), lambda: {"healthy": True}, one_token(TOKEN), None, alerts=alerts, step=step
    )
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(state), host="127.0.0.1"))
    await c.start_server()
    yield c, got, steps
    await c.close()


async def test_webhook_accepts_and_queues(client: Any) -> None:
    c, got, _ = client
    resp = await c.post("/alertmanager", data=FIRING, headers=AUTH)
    assert resp.status == 200 and (await resp.json()) == {"accepted": 1, "ignored": 0}
    assert got[0][0].fingerprint == "e233e67d778488bc"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0123456"}, {"Authorization": TOKEN}])
async def test_webhook_needs_the_token(client: Any, headers: dict[str, str]) -> None:
    c, got, _ = client
    resp = await c.post("/alertmanager", data=FIRING, headers=headers)
    assert resp.status == 401 and not got


@pytest.mark.parametrize("body", [b"", b"{", b'{"version": "4", "alerts": "x"}', b"\xff\xfe"])
async def test_webhook_bad_body_is_400(client: Any, body: bytes) -> None:
    c, got, _ = client
    resp = await c.post("/alertmanager", data=body, headers=AUTH)
    assert resp.status == 400 and "error" in await resp.json() and not got


async def test_step_endpoint(client: Any) -> None:
    c, _, steps = client
    assert (await c.post("/remediation/step", json={"step": "ray_stop", "id": "a"})).status == 401
    assert (await c.post("/remediation/step", data=b"[", headers=AUTH)).status == 400
    assert (await c.post("/remediation/step", json={"step": 1}, headers=AUTH)).status == 400
    resp = await c.post("/remediation/step", json={"step": "ray_stop", "id": "a"}, headers=AUTH)
    assert resp.status == 200 and steps == ["ray_stop"]


async def test_step_needs_a_configured_token(tmp_path: Path) -> None:
    store = ResultStore("dgx-a")
    state = AppState(store, make_registry(store), lambda: {"healthy": True}, one_token(None), None)
    c: TestClient[Any, Any] = TestClient(TestServer(make_app(state), host="127.0.0.1"))
    await c.start_server()
    try:
        resp = await c.post("/remediation/step", json={"step": "ray_stop", "id": "a"})
        assert resp.status == 403
    finally:
        await c.close()


async def test_bad_bodies_leave_the_server_answering(client: Any) -> None:
    """A bad payload is refused (a 400 naming where, msgspec's path; 413 past the body cap), and the next good one
    is queued."""
    c, got, _ = client
    bad = json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {"a": 1}}]}).encode()
    for body in (bad, b"[" * 100_000, b'{"version": "4", "alerts": [' + b"1," * 2000 + b"1]}"):
        resp = await c.post("/alertmanager", data=body, headers=AUTH)
        assert resp.status in (400, 413) and not got
    resp = await c.post("/alertmanager", data=bad, headers=AUTH)
    assert "- at `$.alerts[0].labels" in (await resp.json())["error"]
    resp = await c.post("/alertmanager", data=FIRING, headers=AUTH)
    assert resp.status == 200 and len(got) == 1

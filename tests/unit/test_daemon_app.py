from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from dgxdoctor.daemon.app import MAX_BODY_BYTES, STATE_KEY, AppState, auth_middleware, is_loopback, make_app, token_ok
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.settings.daemon import Credentials
from fakechecks import gpu_result
from tokens import one_token
from webtest import TestClient, TestServer

TOKEN = "0123456789abcdef-token"


def app_state(token: str | None, healthy: bool = True) -> AppState:
    store = ResultStore("dgx-a")
    store.put(gpu_result())
    reloads: list[int] = []

    async def reload() -> list[str]:
        reloads.append(1)
        return []

    reload.calls = reloads  # type: ignore[attr-defined]
    state = AppState(store, make_registry(store), lambda: {"healthy": healthy}, one_token(token), reload)
    return state


@pytest.fixture
async def client_factory() -> AsyncIterator[Any]:
    clients: list[TestClient[Any, Any]] = []

    async def make(state: AppState) -> TestClient[Any, Any]:
        client: TestClient[Any, Any] = TestClient(TestServer(make_app(state), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


async def test_metrics_and_healthz_are_open(client_factory: Any) -> None:
    client = await client_factory(app_state(TOKEN))
    resp = await client.get("/metrics")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'dgxdoctor_check_status{check="gpu",node="dgx-a"} 0.0' in await resp.text()
    assert (await client.get("/healthz")).status == 200
    sick = await client_factory(app_state(TOKEN, healthy=False))
    assert (await sick.get("/healthz")).status == 503


async def test_state_needs_the_token(client_factory: Any) -> None:
    client = await client_factory(app_state(TOKEN))
    assert (await client.get("/state")).status == 401
    assert (await client.get("/state", headers={"Authorization": "Bearer wrong"})).status == 401
    assert (await client.get("/state", headers={"Authorization": f"Basic {TOKEN}"})).status == 401
    resp = await client.get("/state", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status == 200
    doc = await resp.json()
    assert doc["node"] == "dgx-a" and doc["checks"][0]["name"] == "gpu"


async def test_without_a_token_loopback_is_refused_too(client_factory: Any) -> None:
    """Any local user reaches loopback: with no token configured, nothing but /healthz and /metrics answers."""
    state = app_state(None)
    client = await client_factory(state)  # the test client connects from 127.0.0.1
    for method, path in [("GET", "/state"), ("GET", "/"), ("POST", "/reload"), ("POST", "/alertmanager"),
                         ("POST", "/bundle/part"), ("POST", "/check/run"), ("POST", "/nccl/join")]:  # fmt: skip
        resp = await client.request(method, path, data=b"{}")
        body = await resp.json()
        assert resp.status == 403 and "none is configured" in body["error"], (path, body)
    assert state.reload.calls == []  # type: ignore[union-attr]
    assert (await client.get("/healthz")).status == 200 and (await client.get("/metrics")).status == 200

    app = make_app(state)
    request = make_mocked_request("GET", "/state", app=app, transport=mock.Mock())
    handler = mock.AsyncMock(return_value=web.Response(text="should not run"))
    response = await auth_middleware(request, handler)
    assert response.status == 403 and not handler.called
    assert request.app[STATE_KEY] is state


READ, ALERT, PEER = "read-0123456789abcdef", "alert-0123456789abcdef", "peer-0123456789abcdef"


@pytest.mark.parametrize(
    ("token", "opens", "refused"),
    [
        (READ, ["GET /state", "GET /"], ["POST /alertmanager", "POST /reload", "POST /bundle/part", "POST /check/run",
                                         "POST /remediation/step", "POST /nccl/join"]),
        (ALERT, ["POST /alertmanager"], ["GET /state", "POST /reload", "POST /bundle/part", "POST /check/run",
                                         "POST /remediation/step", "POST /nccl/join"]),
        (PEER, ["GET /state", "GET /", "POST /reload"], ["POST /alertmanager"]),
    ],
)  # fmt: skip
async def test_each_token_opens_only_its_scope(
    client_factory: Any, token: str, opens: list[str], refused: list[str]
) -> None:
    state = app_state(None)
    state.credentials = Credentials(read=READ, alert=ALERT, peer=PEER)
    client = await client_factory(state)
    auth = {"Authorization": f"Bearer {token}"}
    for call in opens:
        method, path = call.split()
        resp = await client.request(method, path, headers=auth, data=b"{}" if method == "POST" else None)
        assert resp.status not in (401, 403), (token, call, resp.status)
    for call in refused:
        method, path = call.split()
        resp = await client.request(method, path, headers=auth, data=b"{}")
        assert resp.status == 403 and "does not open" in (await resp.json())["error"], (token, call)


async def test_metrics_require_token(client_factory: Any) -> None:
    state = app_state(None)
    state.credentials, state.metrics_require_token = Credentials(read=READ, alert=ALERT, peer=PEER), True
    client = await client_factory(state)
    assert (await client.get("/metrics")).status == 401 and (await client.get("/healthz")).status == 200
    for token, status in ((READ, 200), (PEER, 200), (ALERT, 403)):
        assert (await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})).status == status


async def test_reload_is_protected_and_validates_its_body(client_factory: Any) -> None:
    state = app_state(TOKEN)
    client = await client_factory(state)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await client.post("/reload")).status == 401
    assert (await client.post("/reload", headers=auth, data=b'{"x": 1}')).status == 400
    assert (await client.post("/reload", headers=auth, data=b"not json")).status == 400
    assert (await client.post("/reload", headers=auth, data=b"x" * (MAX_BODY_BYTES + 1))).status == 413
    resp = await client.post("/reload", headers=auth, data=b"{}")
    assert resp.status == 200 and (await resp.json()) == {"reloaded": True, "problems": []}
    assert state.reload.calls == [1]  # type: ignore[union-attr]
    assert (await client.get("/reload", headers=auth)).status == 405


def test_token_compare_and_loopback() -> None:
    assert token_ok(f"Bearer {TOKEN}", TOKEN) and token_ok(f"bearer  {TOKEN}", TOKEN)
    assert not token_ok(None, TOKEN) and not token_ok("Bearer", TOKEN) and not token_ok("Bearer é", TOKEN)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.8.9.10")
    assert not is_loopback("10.78.0.1") and not is_loopback(None) and not is_loopback("dgx-b")


def test_every_configured_token_is_compared() -> None:
    """The comparison does not stop at the first token: which one came close is not in the timing."""
    from dgxdoctor.daemon import access

    assert access.matches(PEER, [READ, PEER]) and access.matches(READ, [READ, PEER])
    assert not access.matches(PEER + "x", [READ, PEER]) and not access.matches("é", [READ])
    assert access.bearer(f"Bearer {PEER}") == PEER and access.bearer("Bearer ") is None
    assert access.basic_password("Basic " + base64.b64encode(f"ops:{READ}".encode()).decode()) == READ
    assert access.scope_of("/metrics") is None and access.scope_of("/metrics", True) == access.READ
    assert access.scope_of("/nccl/join/abc") == access.PEER and access.scope_of("/healthz") is None

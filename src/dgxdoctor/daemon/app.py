"""The HTTP face of the daemon (an aiohttp app, served by ``daemon.connections``): ``/metrics``, ``/healthz``,
``/ready`` (the readiness a load balancer reads, daemon.readiness), ``/state``, ``POST /reload``, ``POST
/alertmanager`` (Alertmanager's webhook), ``POST /remediation/step`` (the head asking a worker), ``POST
/remediation/restart`` (an operator's planned restart), ``POST /check/run`` (a peer's ``check --cluster``), ``POST
/bundle/part`` (a peer's ``bundle --cluster``) and ``GET /`` (the status page).

``/healthz`` and ``/ready`` are open, and ``/metrics`` unless ``metrics_require_token``, as Prometheus and load
balancers expect.
Every other endpoint takes one of three scoped tokens (``daemon.access``: read, alert, peer), sent as
``Authorization: Bearer <token>`` (``GET /`` also takes the read token as the password of HTTP Basic, which a
browser asks for); an endpoint whose token is not configured refuses everyone, loopback included. Request bodies
are capped at ``MAX_BODY_BYTES``.

``make_app`` takes the middlewares that run first (the connection guard's). TLS is the listener's (``serve``'s
``ssl_context``); the client certificate it verified is what ``auth_middleware`` asks of the peer endpoints when
``client_cert_required``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from msgspec import Struct, field
from prometheus_client import CollectorRegistry, generate_latest

from dgxdoctor import __version__
from dgxdoctor.alerts.webhook import IncomingAlert, PayloadError, parse_payload
from dgxdoctor.daemon import access
from dgxdoctor.daemon.connections import lift_deadline, refuse_declared_oversize
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.settings.daemon import Credentials

MAX_BODY_BYTES = 64 * 1024
# The classic text format (what generate_latest writes for our ASCII names); Prometheus 2.x and node_exporter-era
# tooling expect this version string.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The status page loads nothing from anywhere (nodes have no internet): inline style only, no scripts.
PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# What POST /remediation/step takes (remediation/actions.py StepRequest).
STEP_BODY = '{"step": "ray_stop"|"ray_start"|"vllm_stop"|"vllm_start", "id": "...", "ts": ..., "mac": "..."}'


class AppState(Struct):
    store: ResultStore
    registry: CollectorRegistry
    health: Callable[[], dict[str, Any]]
    credentials: Credentials = field(default_factory=Credentials)
    # Reload the config; returns the problems found (empty on success).
    reload: Callable[[], Awaitable[list[str]]] | None = None
    # Webhook alerts in: (accepted, ignored). Queues only; the work happens in the remediation loop.
    alerts: Callable[[list[IncomingAlert]], tuple[int, int]] | None = None
    # The head asks this worker to run a step (the request's JSON object): (HTTP status, answer).
    step: Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]] | None = None
    # An operator's planned restart (its drain flag): (HTTP status, the action's audit record or the refusal).
    restart: Callable[[bool], Awaitable[tuple[int, dict[str, Any]]]] | None = None
    # GET /: the status page (HTML); None: the JSON index of endpoints.
    page: Callable[[], Awaitable[str]] | None = None
    # GET /metrics takes the read (or peer) token too ([daemon] metrics_require_token).
    metrics_require_token: bool = False
    # The listener verifies client certificates ([daemon] tls_client_ca_file): the peer endpoints want one.
    client_cert_required: bool = False
    # Registers the routes of the cross-node NCCL probe's peer side (daemon.nccl_join), when the daemon has it.
    extra_routes: Callable[[web.Application], None] | None = None


STATE_KEY = web.AppKey("dgxdoctor_state", AppState)


def is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def token_ok(header: str | None, token: str) -> bool:
    """``Bearer <token>``, compared in constant time (hmac.compare_digest) so timing leaks nothing."""
    given = access.bearer(header)
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _has_client_cert(request: web.Request) -> bool:
    """The TLS connection carried a client certificate the listener verified (``sources.tls.server_context``)."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    scope = access.scope_of(request.path, state.metrics_require_token)
    if scope is not None:
        page = request.path == "/" and request.method in ("GET", "HEAD")
        cert = _has_client_cert(request) if state.client_cert_required else None
        refused = access.refusal(
            request.path, scope, state.credentials, request.headers.get("Authorization"), page, cert
        )
        if refused is not None:
            headers = {"WWW-Authenticate": f'{refused.challenge} realm="dgxdoctor"'} if refused.challenge else None
            body = {"error": refused.error, "credential": refused.credential}
            return web.json_response(body, status=refused.status, headers=headers)
    return await handler(request)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    report = request.app[STATE_KEY].health()
    return web.json_response(report, status=200 if report.get("healthy") else 503)


async def state(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].store.snapshot())


async def reload(request: web.Request) -> web.Response:
    app_state = request.app[STATE_KEY]
    raw = await request.read()  # capped by client_max_size
    if raw.strip():
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            return _error(400, "body must be empty or an empty JSON object")
        if doc != {}:
            return _error(400, "body must be empty or an empty JSON object (reload takes no parameters)")
    if app_state.reload is None:
        return _error(501, "reload not available")
    problems = await app_state.reload()
    return web.json_response({"reloaded": not problems, "problems": problems}, status=200 if not problems else 422)


async def alertmanager(request: web.Request) -> web.Response:
    """Alertmanager's webhook: validate, queue, answer. Bad payloads are 400 naming the problem, never a 5xx."""
    app_state = request.app[STATE_KEY]
    try:
        alerts = parse_payload(await request.read())
    except PayloadError as exc:
        return _error(400, str(exc))
    if app_state.alerts is None:
        return web.json_response({"accepted": 0, "ignored": len(alerts), "detail": "remediation not running"})
    accepted, ignored = app_state.alerts(alerts)
    return web.json_response({"accepted": accepted, "ignored": ignored})


async def remediation_step(request: web.Request) -> web.Response:
    app_state = request.app[STATE_KEY]
    if app_state.credentials.peer is None:  # the middleware refused already; the step's mac needs it too
        return _error(403, "remediation steps need the peer token (daemon.peer_token_file)")
    try:
        doc = json.loads(await request.read())
    except (ValueError, RecursionError):
        return _error(400, f"body must be JSON: {STEP_BODY}")
    if not isinstance(doc, dict) or not isinstance(doc.get("step"), str) or not isinstance(doc.get("id", ""), str):
        return _error(400, f"body must be {STEP_BODY}")
    if app_state.step is None:
        return _error(409, "remediation not running")
    lift_deadline(request)  # authenticated (the middleware checked the peer token): the step has its own timeout
    status, answer = await app_state.step(doc)
    return web.json_response(answer, status=status)


async def remediation_restart(request: web.Request) -> web.Response:
    """``{"drain": true|false}``: restart vLLM here now through remediation's guard and audit; answers when done."""
    app_state = request.app[STATE_KEY]
    try:
        doc = json.loads(await request.read() or b"{}")
    except (ValueError, RecursionError):
        return _error(400, 'body must be {"drain": true|false}')
    if not isinstance(doc, dict) or set(doc) - {"drain"} or not isinstance(doc.get("drain", False), bool):
        return _error(400, 'body must be {"drain": true|false}')
    if app_state.restart is None:
        return _error(409, "remediation not running")
    lift_deadline(request)  # authenticated: the restart has its own timeouts (drain, commands, verification)
    status, answer = await app_state.restart(bool(doc.get("drain", False)))
    return web.json_response(answer, status=status)


async def index(request: web.Request) -> web.Response:
    page = request.app[STATE_KEY].page
    if page is not None and "application/json" not in request.headers.get("Accept", ""):
        headers = {"Cache-Control": "no-store", "Content-Security-Policy": PAGE_CSP}
        return web.Response(text=await page(), content_type="text/html", charset="utf-8", headers=headers)
    return web.json_response(
        {
            "service": "dgxdoctor",
            "version": __version__,
            "endpoints": [
                "/",
                "/metrics",
                "/healthz",
                "/state",
                "/reload",
                "/alertmanager",
                "/remediation/step",
                "/remediation/restart",
                "/ready",
                "/check/run",
                "/bundle/part",
            ],
        }
    )


def make_app(app_state: AppState, outer: tuple[Any, ...] = ()) -> web.Application:
    """The app; ``outer`` middlewares run first (the connection guard's deadline and request accounting), then the
    token check, then the refusal of a body declared over the cap."""
    middlewares = [*outer, auth_middleware, refuse_declared_oversize]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = app_state
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/state", state)
    app.router.add_post("/reload", reload)
    app.router.add_post("/alertmanager", alertmanager)
    app.router.add_post("/remediation/step", remediation_step)
    app.router.add_post("/remediation/restart", remediation_restart)
    if app_state.extra_routes is not None:
        app_state.extra_routes(app)
    return app

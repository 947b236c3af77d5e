"""Which credential each endpoint takes, and the refusal when a request lacks it (``app.auth_middleware``).

Three scopes (docs/daemon.md "Credentials"):

- read: ``GET /`` (the status page), ``/state``, and ``/metrics`` when ``metrics_require_token`` is set. The read
  token or the peer token opens them.
- alert: ``POST /alertmanager``, which may restart things in act mode. Only the alert token opens it: the page's
  password does not, and what Alertmanager holds opens nothing else.
- peer: ``/bundle/part`` (the kernel log, log tails, the serving processes' environments), ``/check/run``,
  ``/reload``, ``/remediation/step``, ``/remediation/restart`` and ``/nccl/*``. Only the peer token, the same on
  every node.

A scope whose token is not configured refuses everyone, loopback included (any local user reaches loopback): 403
naming the key to set. A token configured but not sent, or wrong, is 401 with a challenge; a valid token of another
scope is 403 naming the one wanted. Every comparison is constant-time and every configured token is compared, so
the answer's timing tells nothing about which one came close.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Iterable

from msgspec import Struct

from dgxdoctor.settings.daemon import Credentials

READ, ALERT, PEER = "read", "alert", "peer"

READ_PATHS = frozenset({"/", "/state"})
ALERT_PATHS = frozenset({"/alertmanager"})
PEER_PATHS = frozenset({"/bundle/part", "/check/run", "/reload", "/remediation/step", "/remediation/restart"})
PEER_PREFIXES = ("/nccl/",)

# The key that gives each scope's token, for the refusal's text.
KEYS = {READ: "read_token_file (or peer_token_file)", ALERT: "alert_token_file", PEER: "peer_token_file"}
HOW = "a file holding `head -c 32 /dev/urandom | base64`, mode 0600 (docs/daemon.md, Credentials)"


class Refusal(Struct, frozen=True):
    status: int
    error: str
    credential: str
    challenge: str | None = None  # the WWW-Authenticate scheme, on a 401


def scope_of(path: str, metrics_require_token: bool = False) -> str | None:
    """The scope ``path`` needs; None for the open endpoints (``/healthz``, ``/ready``, ``/metrics`` by default)."""
    if path in READ_PATHS or (path == "/metrics" and metrics_require_token):
        return READ
    if path in ALERT_PATHS:
        return ALERT
    if path in PEER_PATHS or path.startswith(PEER_PREFIXES):
        return PEER
    return None


def accepted(scope: str, creds: Credentials) -> list[str]:
    """The configured tokens that open ``scope`` (the peer token also opens what the read token does)."""
    tokens = {READ: (creds.read, creds.peer), ALERT: (creds.alert,), PEER: (creds.peer,)}[scope]
    return [t for t in tokens if t is not None]


def bearer(header: str | None) -> str | None:
    """The token of ``Bearer <token>`` (any case of the scheme), else None."""
    scheme, _, given = (header or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def basic_password(header: str | None) -> str | None:
    """The password of ``Basic base64(user:password)``: how a browser sends the read token to ``GET /``."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(given.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return decoded.partition(":")[2] or None


def matches(given: str, tokens: Iterable[str]) -> bool:
    """``given`` equals one of ``tokens``, each compared in constant time, and all of them compared."""
    raw = given.encode("utf-8", "replace")
    found = False
    for token in tokens:
        found |= hmac.compare_digest(raw, token.encode("utf-8"))
    return found


def refusal(
    path: str, scope: str, creds: Credentials, header: str | None, page: bool, has_client_cert: bool | None
) -> Refusal | None:
    """None when the request may go on. ``page``: ``GET /``, where HTTP Basic (a browser's prompt) also works.
    ``has_client_cert``: None when the listener asks for none; False refuses the peer scope."""
    wanted = accepted(scope, creds)
    if not wanted:
        return Refusal(
            403,
            f"{path} needs the {scope} token and none is configured on this node: set [daemon] {KEYS[scope]}, {HOW}",
            scope,
        )
    if scope == PEER and has_client_cert is False:
        return Refusal(403, f"{path} needs a client certificate (daemon.tls_client_ca_file is set here)", scope)
    given = bearer(header) or (basic_password(header) if page else None)
    if given is not None and matches(given, wanted):
        return None
    others = [t for t in (creds.read, creds.alert, creds.peer) if t is not None and t not in wanted]
    if given is not None and matches(given, others):
        return Refusal(403, f"this token does not open {path}: it needs the {scope} token ({KEYS[scope]})", scope)
    challenge = "Basic" if page else "Bearer"  # a browser asks for the read token (as the password) for /
    return Refusal(401, f"missing or wrong bearer token: {path} needs the {scope} token", scope, challenge)

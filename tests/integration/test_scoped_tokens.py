"""The daemon's three credentials and its TLS listener, against a real ``dgxdoctor run`` over real sockets
(issue 34: "No token opens more than the docs say", "One token for everything, in clear").

Every request here comes from this test's process on loopback, which is where any local user (``nobody``) stands.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import REPO
from daemonproc import DaemonProc
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.daemon.connections import Limits
from tlscerts import Pki, make_pki, write_token

pytestmark = pytest.mark.integration

READ, ALERT, PEER = "read-token-0123456789abcdef", "alert-token-0123456789abcd", "peer-token-0123456789abcdef"
QUIET = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS)
ALERT_BODY = {"version": "4", "status": "firing", "alerts": []}
# What each protected endpoint is sent: valid bodies, so that a refusal can only be the credential's.
PEER_POSTS = {
    "/bundle/part": {"since_s": 60, "deadline_s": 5},
    "/check/run": {},
    "/reload": {},
    "/remediation/step": {"step": "ray_stop", "id": "x", "ts": 0, "mac": "0" * 64},
}


def config(tmp_path: Path, daemon_extra: str = "") -> str:
    return (
        f'node = "it-node"\n[daemon]\nlisten = "@LISTEN@"\n{daemon_extra}\n'
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\n{QUIET}'
    )


def token_keys(tmp_path: Path) -> str:
    files = {k: write_token(tmp_path / "tokens" / k, v) for k, v in (("read", READ), ("alert", ALERT), ("peer", PEER))}
    return "".join(f'{name}_token_file = "{path}"\n' for name, path in files.items())


def started(d: DaemonProc) -> DaemonProc:
    d.start()
    try:
        d.wait_healthy()
    except BaseException:
        d.kill()
        raise
    return d


@pytest.fixture
def open_daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = started(DaemonProc(tmp_path / "d", config(tmp_path)))
    yield d
    d.kill()


@pytest.fixture
def scoped_daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = started(DaemonProc(tmp_path / "d", config(tmp_path, token_keys(tmp_path))))
    yield d
    d.kill()


def post(d: DaemonProc, path: str, body: object, token: str | None = None, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{d.url}{path}", json=body, headers=headers, timeout=30, verify=d.verify, **kw)  # type: ignore[arg-type]


def get(d: DaemonProc, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{d.url}{path}", headers=headers, timeout=10, verify=d.verify)


def test_with_no_token_configured_loopback_is_refused_too(open_daemon: DaemonProc) -> None:
    """Before: 200 from /bundle/part (the kernel log, log tails, the serving processes' environments), /check/run
    and /reload for any local user."""
    d = open_daemon
    for path, body in {**PEER_POSTS, "/alertmanager": ALERT_BODY}.items():
        answer = post(d, path, body)
        assert answer.status_code == 403, (path, answer.status_code, answer.text)
        error = answer.json()
        key = "alert_token_file" if path == "/alertmanager" else "peer_token_file"
        assert key in error["error"] and "none is configured" in error["error"], (path, error)
    for path in ("/state", "/"):
        answer = get(d, path)
        assert answer.status_code == 403 and "read_token_file" in answer.json()["error"], (path, answer.text)
    assert get(d, "/healthz").status_code == 200 and get(d, "/metrics").status_code == 200
    assert "no_token" in d.log_text()


def test_each_token_opens_its_own_endpoints_only(scoped_daemon: DaemonProc) -> None:
    d = scoped_daemon
    # Alertmanager's token: the webhook, and nothing that reads secrets or acts.
    assert post(d, "/alertmanager", ALERT_BODY, ALERT).status_code == 200
    for path, body in PEER_POSTS.items():
        answer = post(d, path, body, ALERT)
        assert answer.status_code == 403 and "peer token" in answer.json()["error"], (path, answer.text)
    assert get(d, "/state", ALERT).status_code == 403
    # The page's password: the page and /state, not the webhook, not the peer endpoints.
    assert get(d, "/state", READ).status_code == 200
    page = httpx.get(f"{d.url}/", auth=("ops", READ), timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert post(d, "/alertmanager", ALERT_BODY, READ).status_code == 403
    for path, body in PEER_POSTS.items():
        assert post(d, path, body, READ).status_code == 403, path
    # The peer token: the peer endpoints and what the read token opens; the webhook is Alertmanager's alone.
    assert get(d, "/state", PEER).status_code == 200
    assert post(d, "/reload", {}, PEER).status_code == 200
    assert post(d, "/check/run", {}, PEER).status_code == 200
    part = post(d, "/bundle/part", PEER_POSTS["/bundle/part"], PEER)
    assert part.status_code == 200 and part.content[:2] == b"\x1f\x8b"  # a gzip'd tar
    assert post(d, "/remediation/step", PEER_POSTS["/remediation/step"], PEER).status_code != 403
    assert post(d, "/alertmanager", ALERT_BODY, PEER).status_code == 403
    # No token, or a wrong one: 401 with a challenge.
    for path, body in PEER_POSTS.items():
        answer = post(d, path, body, "wrong-token-0123456789abcdef")
        assert answer.status_code == 401 and "Bearer" in answer.headers["www-authenticate"], path
    assert get(d, "/state").status_code == 401 and get(d, "/metrics").status_code == 200


def test_metrics_require_token(tmp_path: Path) -> None:
    d = started(DaemonProc(tmp_path / "d", config(tmp_path, token_keys(tmp_path) + "metrics_require_token = true\n")))
    try:
        assert get(d, "/metrics").status_code == 401 and get(d, "/metrics", ALERT).status_code == 403
        assert get(d, "/metrics", READ).status_code == 200 and get(d, "/healthz").status_code == 200
    finally:
        d.kill()


def test_deprecated_single_token_keeps_working_with_a_warning(tmp_path: Path) -> None:
    old = write_token(tmp_path / "token", PEER)
    d = started(DaemonProc(tmp_path / "d", config(tmp_path, f'token_file = "{old}"\n')))
    try:
        assert post(d, "/alertmanager", ALERT_BODY, PEER).status_code == 200
        assert get(d, "/state", PEER).status_code == 200 and post(d, "/reload", {}, PEER).status_code == 200
        assert "config_warning" in d.log_text() and "token_file is deprecated" in d.log_text()
    finally:
        d.kill()


# -- TLS --------------------------------------------------------------------------------------------------


def client_context(pki: Pki, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        ctx.load_cert_chain(str(pki.cert), str(pki.key))
    return ctx


@pytest.fixture
def tls_daemon(tmp_path: Path) -> Iterator[tuple[DaemonProc, Pki]]:
    pki = make_pki(tmp_path / "pki")
    tls = f'tls_cert_file = "{pki.cert}"\ntls_key_file = "{pki.key}"\ntls_client_ca_file = "{pki.ca}"\n'
    d = DaemonProc(tmp_path / "d", config(tmp_path, token_keys(tmp_path) + tls), host="127.0.0.1")
    d.scheme, d.verify = "https", client_context(pki, with_cert=False)
    yield started(d), pki
    d.kill()


def test_tls_listener_refuses_plain_http_and_a_peer_without_a_client_cert(
    tls_daemon: tuple[DaemonProc, Pki], tmp_path: Path
) -> None:
    d, pki = tls_daemon
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port: no HTTP answer comes back
        httpx.get(f"http://127.0.0.1:{d.port}/healthz", timeout=5)
    stranger = make_pki(tmp_path / "stranger", "stranger")
    with pytest.raises(httpx.HTTPError):  # a certificate from another CA: the handshake fails
        httpx.get(f"{d.url}/healthz", timeout=5, verify=_with_cert(pki.ca, stranger))
    # No client certificate: /healthz and /metrics answer, the read endpoints with the read token too ...
    assert get(d, "/healthz").status_code == 200 and get(d, "/state", READ).status_code == 200
    # ... and the peer endpoints refuse, even with the peer token.
    answer = post(d, "/reload", {}, PEER)
    assert answer.status_code == 403 and "client certificate" in answer.json()["error"]
    d.verify = client_context(pki, with_cert=True)
    assert post(d, "/reload", {}, PEER).status_code == 200
    assert post(d, "/reload", {}, READ).status_code == 403  # a certificate is no token


def test_a_stalled_tls_handshake_is_closed_at_the_head_deadline(tls_daemon: tuple[DaemonProc, Pki]) -> None:
    """The guard sees a TLS connection only after its handshake: a client that connects and sends nothing is closed
    at the request head's deadline (10 s), not asyncio's 60 s."""
    d, _ = tls_daemon
    with socket.create_connection(("127.0.0.1", d.port), timeout=40) as sock:
        t0 = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - t0 < Limits().header_timeout_s + 5


def _with_cert(ca: Path, pki: Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(pki.cert), str(pki.key))
    return ctx


def test_check_cluster_reads_an_https_peer(tls_daemon: tuple[DaemonProc, Pki], tmp_path: Path) -> None:
    """The real client path (``check --cluster --cached``): the peer verified against peer_ca_file, this node's
    certificate presented, the peer token sent."""
    d, pki = tls_daemon
    peer_token = write_token(tmp_path / "head" / "peer", PEER)
    head = tmp_path / "head" / "config.toml"
    head.write_text(
        f'node = "head-node"\n[daemon]\npeers = ["https://localhost:{d.port}"]\npeer_ca_file = "{pki.ca}"\n'
        f'tls_cert_file = "{pki.cert}"\ntls_key_file = "{pki.key}"\npeer_token_file = "{peer_token}"\n'
        f'[paths]\nstate_dir = "{tmp_path / "head" / "state"}"\n{QUIET}'
    )
    run = subprocess.run(
        [sys.executable, "-m", "dgxdoctor", "check", "--config", str(head), "--cluster", "--cached", "--json"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    doc = json.loads(run.stdout)
    peer = next(n for n in doc["nodes"] if not n["local"])
    assert peer["error"] is None and peer["node"] == "it-node" and peer["url"].startswith("https://"), run.stderr


def test_check_cluster_without_a_peer_token_says_the_peers_need_one(open_daemon: DaemonProc, tmp_path: Path) -> None:
    head = tmp_path / "head.toml"
    head.write_text(
        f'node = "head-node"\n[daemon]\npeers = ["{open_daemon.url}"]\n'
        f'[paths]\nstate_dir = "{tmp_path / "head-state"}"\n{QUIET}'
    )
    run = subprocess.run(
        [sys.executable, "-m", "dgxdoctor", "check", "--config", str(head), "--cluster", "--json"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert "no peer token configured" in run.stderr and "peer_token_file" in run.stderr
    peer = next(n for n in json.loads(run.stdout)["nodes"] if not n["local"])
    assert "HTTP 403" in peer["error"] and "peer_token_file" in peer["error"]


def test_bundle_cluster_without_a_peer_token_says_the_peers_need_one(open_daemon: DaemonProc, tmp_path: Path) -> None:
    head = tmp_path / "head.toml"
    (tmp_path / "head-state").mkdir()
    head.write_text(
        f'node = "head-node"\n[daemon]\npeers = ["{open_daemon.url}"]\n'
        f'[paths]\nstate_dir = "{tmp_path / "head-state"}"\n{QUIET}'
    )
    out = tmp_path / "b.tar.gz"
    argv = ["bundle", "--config", str(head), "--cluster", "--deadline", "10", "-o", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "dgxdoctor", *argv], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert "no peer token configured" in run.stderr and "peer_token_file" in run.stderr
    assert run.returncode == 1 and "HTTP 403" in run.stdout and "peer_token_file" in run.stdout, run.stdout

"""Whose listener on base_url's port is vLLM, and whose vLLM processes the fallback believes: by the socket's and
the process's owner (root, the agent's user, ``[node] serving_user``, the pid file's process's user), never by
what a process answers or calls itself. The real attack (nobody's HTTP server on the port) is
``tests/integration/test_attack_vllm_port.py``; a laid-out tree covers the rest."""

from __future__ import annotations

import shutil
import time
from ipaddress import IPv6Address
from pathlib import Path

import httpx
import pytest

from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.environment import Environment
from dgxdoctor.remediation.actions import VllmTarget, port_impostor, verify_vllm
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources import procfs, vllm_api
from dgxdoctor.sources.vllm_metrics import NotVllmMetrics
from proctree import TCP_HEADER, tcp_listen_line, write_process

SERVING, OTHER, PORT = 4242, 4243, 18765
API_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", str(PORT)]
V4_LOOPBACK, V4_WILDCARD, V4_NODE = "0100007F", "00000000", "0500000A"  # 127.0.0.1, 0.0.0.0, 10.0.0.5


@pytest.fixture
def root(tmp_path: Path, fixtures: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    shutil.copy(fixtures / "vllm" / "proc" / "stat", root / "stat")
    return root


def listen_on(root: Path, pid: int, uid: int, inode: int, addr: str = V4_LOOPBACK, tcp: str = "tcp") -> None:
    """``pid`` (of ``uid``) listens on ``addr``:PORT: its line in ``net/tcp`` (or tcp6) and its fd link."""
    table = root / "net" / tcp
    table.parent.mkdir(exist_ok=True)
    lines = table.read_text() if table.exists() else TCP_HEADER
    table.write_text(lines + tcp_listen_line(lines.count("\n") - 1, PORT, uid, inode, addr))
    fds = root / str(pid) / "fd"
    fds.mkdir(parents=True, exist_ok=True)
    (fds / "3").symlink_to(f"socket:[{inode}]")


def refused() -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    return httpx.MockTransport(answer)


def healthy(asked: list[str], metrics: str = "") -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 3}})
        return httpx.Response(200, text="")

    return httpx.MockTransport(answer)


@pytest.fixture
def idle(fixtures: Path) -> str:
    return (fixtures / "vllm" / "metrics-0.32.0-idle.txt").read_text()


def run_check(
    root: Path, transport: httpx.MockTransport, serving_uid: int | None = None, now: float | None = None, **kw: object
) -> CheckResult:
    clock = time.time if now is None else lambda: now
    env = Environment(node="n1", proc_root=root, http_transport=transport, serving_uid=serving_uid, clock=clock)
    s = VllmSettings(base_url=f"http://127.0.0.1:{PORT}", canary="never", oneshot_window_s=0, **kw)  # type: ignore[arg-type]
    return VllmCheck(s, env).run()


# ----- the fallback by command line: [node] serving_user --------------------------------------------------------


def test_the_fallback_believes_the_serving_users_vllm(root: Path) -> None:
    write_process(root, 100, "python3", API_SERVER, uid=SERVING)
    assert vllm_api.vllm_by_command_line(root, PORT) == (None, "no vLLM process on this node")
    found, why = vllm_api.vllm_by_command_line(root, PORT, serving_uid=SERVING)
    assert found is not None and found.pid == 100 and why is None
    assert vllm_api.vllm_by_command_line(root, PORT, serving_uid=OTHER)[0] is None


def test_the_check_passes_serving_uid_to_the_fallback(root: Path) -> None:
    """Nothing listens: the serving user's vLLM is the process that exists but does not listen (not "no vLLM")."""
    write_process(root, 100, "python3", API_SERVER, uid=SERVING)
    dead = run_check(root, refused(), SERVING, required=True, startup_grace_s=0)
    assert dead.status is Status.CRITICAL and "process 100 (" in dead.findings[0].message, dead.findings
    assert "exists but does not listen" in dead.findings[0].message
    started = vllm_api.user_process(root, 100).start_time  # type: ignore[union-attr]
    assert started is not None
    loading = run_check(root, refused(), SERVING, now=started + 10)  # within the start-up grace: loading
    assert loading.status is Status.OK and [f.code for f in loading.findings] == ["VLLM_LOADING"]
    unknown_user = run_check(root, refused(), None, required=True, startup_grace_s=0)
    assert "no vLLM process on this node" in unknown_user.findings[0].message


# ----- the listener: the socket's owner -----------------------------------------------------------------------


def test_a_listener_of_another_user_is_named_and_never_the_api_server(root: Path) -> None:
    write_process(root, 300, "python3", API_SERVER, uid=OTHER)  # it even looks like vLLM
    listen_on(root, 300, OTHER, 9001)
    view = vllm_api.port_view(root, PORT, "127.0.0.1", procfs.trusted_uids(serving_uid=SERVING))
    assert view.server is None and view.impostor == vllm_api.PortHolder(PORT, OTHER, 300)
    assert view.impostor.describe() == f"port {PORT} is held by pid 300 of uid {OTHER}, not the serving user: not vLLM"
    assert vllm_api.find_vllm_process(root, PORT, serving_uid=SERVING) == (None, view.impostor.describe())
    trusted = vllm_api.port_view(root, PORT, "127.0.0.1", procfs.trusted_uids(serving_uid=OTHER))
    assert trusted.server is not None and trusted.server.pid == 300 and trusted.impostor is None


def test_the_check_asks_nothing_of_another_users_listener(root: Path, idle: str) -> None:
    write_process(root, 300, "python3", ["python3", "-m", "http.server", str(PORT)], uid=OTHER)
    listen_on(root, 300, OTHER, 9001)
    asked: list[str] = []
    result = run_check(root, healthy(asked), SERVING, required=True)
    assert result.status is Status.CRITICAL and [f.code for f in result.findings] == ["VLLM_DEAD"]
    assert f"held by pid 300 of uid {OTHER}" in result.findings[0].message and asked == []
    assert run_check(root, healthy(asked), SERVING).status is Status.SKIPPED and asked == []
    assert run_check(root, healthy(asked, idle), OTHER).status is Status.OK and "/health" in asked  # declared


def test_the_daemons_progress_follower_reads_no_metrics_of_another_users_listener(root: Path, idle: str) -> None:
    """Between runs the daemon reads /metrics every 2 s: never from the impostor (a failed read wakes the check)."""
    write_process(root, 300, "python3", ["python3", "-m", "http.server"], uid=OTHER)
    listen_on(root, 300, OTHER, 9001)
    env = Environment(node="n1", proc_root=root, serving_uid=SERVING, one_shot=False)
    check = VllmCheck(VllmSettings(base_url=f"http://127.0.0.1:{PORT}"), env)
    asked: list[str] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", transport=healthy(asked, idle)) as client:
        with pytest.raises(NotVllmMetrics, match=f"held by pid 300 of uid {OTHER}"):
            check._follow_metrics(client)
        assert asked == []
        # the impostor gone, the serving user's vLLM listens: read as ever
        (root / "net" / "tcp").write_text(TCP_HEADER + tcp_listen_line(0, PORT, SERVING, 9002, V4_WILDCARD))
        assert check._follow_metrics(client).kv_cache_usage is not None and asked == ["/metrics"]


def test_a_trusted_vllm_loading_beside_an_impostor_is_not_ok(root: Path) -> None:
    """vLLM started but cannot bind a port another user holds: dead, not "still loading"."""
    write_process(root, 100, "python3", API_SERVER, uid=SERVING)
    write_process(root, 300, "python3", ["python3", "-m", "http.server"], uid=OTHER)
    listen_on(root, 300, OTHER, 9001)
    result = run_check(root, healthy([]), SERVING)
    assert result.status is Status.CRITICAL and "process 100 (" in result.findings[0].message


def test_the_pid_files_process_user_is_believed(root: Path, tmp_path: Path, idle: str) -> None:
    write_process(root, 100, "python3", API_SERVER, uid=OTHER)
    listen_on(root, 100, OTHER, 9001)
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text("100\n")
    assert run_check(root, healthy([], idle), None, pid_file=pid_file).status is Status.OK
    assert run_check(root, healthy([], idle), None, required=True).status is Status.CRITICAL


def test_the_socket_a_connection_reaches_decides(root: Path) -> None:
    """vLLM (root) bound to the node's address, another user on 127.0.0.1: base_url 127.0.0.1 reaches the latter.
    An exact bind beats the wildcard; a host name (not resolved) counts every socket on the port."""
    write_process(root, 100, "python3", API_SERVER, uid=0)
    write_process(root, 300, "python3", ["python3", "-m", "http.server"], uid=OTHER)
    listen_on(root, 100, 0, 9000, V4_NODE)
    listen_on(root, 300, OTHER, 9001, V4_LOOPBACK)
    trusted = procfs.trusted_uids()
    assert vllm_api.port_view(root, PORT, "127.0.0.1", trusted).impostor is not None
    node = vllm_api.port_view(root, PORT, "10.0.0.5", trusted)
    assert node.server is not None and node.server.pid == 100 and node.impostor is None
    assert vllm_api.port_view(root, PORT, "dgx-a", trusted).impostor is not None
    assert vllm_api.port_view(root, PORT, "localhost", trusted).impostor is not None


def test_a_wildcard_listener_is_reached_by_loopback_and_v4_mapped_binds_count(root: Path) -> None:
    write_process(root, 100, "python3", API_SERVER, uid=0)
    listen_on(root, 100, 0, 9000, V4_WILDCARD)
    view = vllm_api.port_view(root, PORT, "127.0.0.1", procfs.trusted_uids())
    assert view.server is not None and view.server.pid == 100
    write_process(root, 300, "python3", ["python3", "-m", "http.server"], uid=OTHER)
    listen_on(root, 300, OTHER, 9001, "0000000000000000FFFF00000100007F", tcp="tcp6")  # ::ffff:127.0.0.1
    assert vllm_api.port_view(root, PORT, "127.0.0.1", procfs.trusted_uids()).impostor is not None


def test_socket_addresses_as_the_kernel_writes_them() -> None:
    assert str(procfs.socket_ip("0100007F")) == "127.0.0.1"
    assert str(procfs.socket_ip("00000000000000000000000001000000")) == "::1"
    mapped = procfs.socket_ip("0000000000000000FFFF00000100007F")
    assert isinstance(mapped, IPv6Address) and str(mapped.ipv4_mapped) == "127.0.0.1"
    assert procfs.socket_ip("XYZ") is None and procfs.socket_ip("0100") is None


# ----- remediation's verification after a restart ---------------------------------------------------------------


def test_the_verification_asks_nothing_of_a_port_another_user_holds(root: Path) -> None:
    write_process(root, 300, "python3", ["python3", "-m", "http.server"], uid=OTHER)
    listen_on(root, 300, OTHER, 9001)
    target = VllmTarget(f"http://127.0.0.1:{PORT}", "tiny")
    asked: list[str] = []
    with httpx.Client(transport=healthy(asked)) as client:
        impostor = lambda: port_impostor(target, root, SERVING)  # noqa: E731
        step = verify_vllm(target, 0.0, client, lambda _: None, impostor)
        assert not step.ok and f"held by pid 300 of uid {OTHER}, not the serving user" in step.detail
        assert asked == []
        believed = verify_vllm(target, 0.0, client, lambda _: None, lambda: port_impostor(target, root, OTHER))
    assert believed.ok, believed.detail
    assert asked == ["/health", "/v1/models", "/v1/chat/completions"]

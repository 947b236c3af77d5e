"""Hardening, the unit-sized parts: the agent's own descriptor exhaustion, secrets in errors, isolated interpreters,
bounded logging of malformed requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import REPO
from dgxdoctor import eventlog
from dgxdoctor.checks.drift import DriftCheck, DriftSettings
from dgxdoctor.config import ConfigError, load_config
from dgxdoctor.daemon.ratelog import RateLimit, RequestLog
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon
from dgxdoctor.environment import Environment
from dgxdoctor.sources.http import AgentExhausted, CappedTransport

SECRET = "S3cretButShort1"

# The vllm check against a live loopback server, in a child whose open files are used up first: before, the check
# said CRITICAL "vLLM dead: [Errno 24] Too many open files" about a vLLM that was fine.
SERVER = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
EXHAUSTED_CHILD = """
import asyncio, json, resource, subprocess, sys
from dgxdoctor.checks.base import CheckRunner
from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.environment import Environment

server = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True)
url = "http://127.0.0.1:" + server.stdout.readline().strip()
env = Environment(node="n", proc_root=sys.argv[1])
check = VllmCheck(VllmSettings(base_url=url, required=True, canary="never"), env)
loop = asyncio.new_event_loop()
first = loop.run_until_complete(CheckRunner(env).run(check))  # as in the daemon: everything imported, vLLM up
assert first.status.value != "critical" and "up" in first.summary, first
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
hold = []
try:
    while True:
        hold.append(open("/dev/null"))
except OSError:
    pass
result = loop.run_until_complete(CheckRunner(env).run(check))
hold.clear()
server.kill()
print(json.dumps({"status": result.status.value, "summary": result.summary, "error": result.error,
                  "codes": [f.code for f in result.findings]}))
"""


def test_own_fd_exhaustion_is_not_blamed_on_vllm(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", EXHAUSTED_CHILD, str(tmp_path / "proc"), SERVER],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["status"] == "unknown", got
    assert "VLLM_DEAD" not in got["codes"] and "dead" not in got["summary"].lower(), got
    assert "dgxdoctor itself is out of open files" in (got["error"] or got["summary"]), got


def test_transport_names_exhaustion_and_passes_other_errors() -> None:
    def emfile(request: httpx.Request) -> httpx.Response:
        try:
            raise OSError(24, "Too many open files")
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with (
        httpx.Client(transport=CappedTransport(httpx.MockTransport(emfile))) as client,
        pytest.raises(AgentExhausted, match="out of open files"),
    ):
        client.get("http://vllm:8000/health")
    with (
        httpx.Client(transport=CappedTransport(httpx.MockTransport(refused))) as client,
        pytest.raises(httpx.ConnectError),
    ):
        client.get("http://vllm:8000/health")


def test_config_errors_never_show_a_secret(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[daemon]\ntoken = "{SECRET}"\npeers = ["http://admin:{SECRET}@dgx-b:9835"]\n'
        f"[checks.vllm]\napi_key = 12345678\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    text = str(caught.value)
    assert "Expected `str` of length >= 16 - at `$.daemon.token`" in text
    assert "expected a string, got int - at `$.checks.vllm.api_key`" in text and "12345678" not in text
    assert SECRET not in text and "admin" not in text


async def test_rejected_reload_does_not_echo_the_token(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    good = f'node = "a"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n[daemon]\ntoken = "long-enough-token-0123"\n'
    config.write_text(good)
    daemon = Daemon(load_config(config), config, notifier=Notifier({}))
    config.write_text(good.replace("long-enough-token-0123", SECRET))
    with eventlog.capture_logs() as logs:
        problems = await daemon.reload()
    assert problems and "daemon.token" in problems[0]
    assert SECRET not in json.dumps(problems) and SECRET not in json.dumps(logs, default=str)
    assert daemon.token == "long-enough-token-0123"


PLANTED = "import pathlib; pathlib.Path({marker!r}).write_text('imported')\n"


@pytest.mark.parametrize("module", ["platform", "json"])
def test_version_probe_imports_nothing_from_cwd_or_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """Before: ``dgxdoctor check`` as root in a directory another user can write ran that user's platform.py."""
    planted = tmp_path / "writable-by-anyone"
    planted.mkdir()
    marker = tmp_path / "marker"
    (planted / f"{module}.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    env = Environment(node="n", proc_root=tmp_path / "proc")
    check = DriftCheck(DriftSettings(serving_python=sys.executable), env)
    result = check.run()
    assert not marker.exists(), f"the probe imported the planted {module}.py"
    assert result.facts.get("python_version") == ".".join(map(str, sys.version_info[:3])), result


def test_nccl_probe_runs_isolated_from_a_fixed_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dgxdoctor.checks.nccl import NcclCheck, NcclSettings

    planted = tmp_path / "writable-by-anyone"
    planted.mkdir()
    marker = tmp_path / "marker"
    (planted / "argparse.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    check = NcclCheck(NcclSettings(serving_python=sys.executable, timeout_s=30, env_file=None), Environment(node="n"))
    argv = check.argv()
    assert argv is not None and argv[argv.index(sys.executable) + 1] == "-I"
    check.run()
    assert not marker.exists(), "the all-reduce probe imported the planted argparse.py"


def test_rate_limit_allows_a_burst_then_counts() -> None:
    now = [0.0]
    limit = RateLimit(burst=3, window_s=10, monotonic=lambda: now[0])
    assert [limit.allow()[0] for _ in range(10)] == [True] * 3 + [False] * 7
    now[0] = 10.0
    assert limit.allow() == (True, 7)


def test_request_log_counts_bad_requests_in_one_bounded_line() -> None:
    from aiohttp.http_exceptions import BadStatusLine

    request_log = RequestLog()
    with eventlog.capture_logs() as logs:
        for _ in range(1000):
            # What aiohttp's request handler calls for a malformed request.
            request_log.exception("Error handling request from %s", "10.0.0.9", exc_info=BadStatusLine("GARBAGE"))
    assert request_log.bad_requests == 1000
    assert len(logs) == 5 and all(e["event"] == "http_bad_request" and "exc_info" not in e for e in logs)
    assert logs[0]["remote"] == "10.0.0.9" and "BadStatusLine" in logs[0]["error"]

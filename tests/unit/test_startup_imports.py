"""What each command imports (no timing here: benchmarks/startup.py measures the seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PROBE = """
import json, sys
sys.argv = ["dgxdoctor", *json.loads(sys.argv[1])]
from dgxdoctor.cli import main
try:
    main()
except SystemExit:
    pass
sys.stdout.flush()
print("\\n" + json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def modules_after(*args: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(args))],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def loaded(modules: set[str], *names: str) -> list[str]:
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_help_loads_click_alone() -> None:
    unwanted = ("dgxdoctor.validation", "httpx", "asyncio", "structlog", "apscheduler", "aiohttp", "dgxdoctor.checks")
    assert loaded(modules_after("--help"), *unwanted) == []


@pytest.mark.parametrize("command", [("check", "--only", "host"), ("diagnose", "-")])
def test_one_shot_commands_load_no_server_scheduler_or_renderers(command: tuple[str, ...]) -> None:
    """APScheduler, structlog and aiohttp are the daemon's alone: a command's event lines come from
    dgxdoctor.eventlog's standard-library path (daemon.logconfig imports structlog only for ``run``)."""
    heavy = ("aiohttp", "apscheduler", "dgxdoctor.daemon.app", "dgxdoctor.daemon.connections",
             "dgxdoctor.dashboards", "matplotlib", "structlog")  # fmt: skip
    assert loaded(modules_after(*command), *heavy) == []


def test_check_loads_only_what_this_node_needs(tmp_path: Path) -> None:
    """Every default check on a node without GPUs, logs or vLLM (this machine): the exporter's library, the log
    catalog's RE2 and psutil are loaded by the check that needs them, and none needs them here. The kernel log is a
    private empty one: the machine's own holds what other tests wrote there, and its fault lines rightly load RE2."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = tmp_path / "dgxdoctor.toml"
    config.write_text(f'[paths]\nkmsg_path = "{kmsg}"\nstate_dir = "{tmp_path / "state"}"\n')
    modules = modules_after("check", "--config", str(config))
    assert "dgxdoctor.checks.logs" in modules and "dgxdoctor.checks.host" in modules
    assert loaded(modules, "prometheus_client", "re2", "psutil", "structlog", "aiohttp") == []


def test_check_builds_no_document_model_or_peer_fetch_for_its_table() -> None:
    """The results document's models are built only for ``--json``, peer_compare's fetch only in the daemon, and
    the one-shot run waits on its own thread: no event loop."""
    modules = modules_after("check", "--only", "host,peer_compare")
    assert "dgxdoctor.checks.peer_compare" in modules
    assert loaded(modules, "dgxdoctor.documents", "dgxdoctor.fleet.peers", "asyncio") == []


def test_check_json_builds_the_results_document_and_defaults_read_no_toml() -> None:
    assert loaded(modules_after("check", "--only", "host"), "tomllib", "tomli", "dgxdoctor.compat.tomllib") == []
    assert "dgxdoctor.documents" in modules_after("check", "--only", "host", "--json")


def test_diagnose_of_a_kernel_line_loads_no_settings_models(tmp_path: Path) -> None:
    """The IB verdicts hold the infiniband check's rule table: the settings load once a paste is ibstat or
    perfquery."""
    paste = tmp_path / "paste.txt"
    paste.write_text("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n")
    modules = modules_after("diagnose", str(paste))
    assert "dgxdoctor.diagnose.kernel_log" in modules
    assert loaded(modules, "dgxdoctor.validation", "dgxdoctor.judge.infiniband", "httpx") == []


def _config(tmp_path: Path, port: int) -> str:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[checks.vllm]\nbase_url = "http://127.0.0.1:{port}"\n[checks.ray]\ndashboard_url = "http://127.0.0.1:{port}"\n'
        f'[paths]\nstate_dir = "{tmp_path}"\n'
    )
    return str(path)


def test_a_refused_vllm_or_ray_port_loads_no_http_client(tmp_path: Path) -> None:
    """Nothing listening (a worker's usual answer for vLLM's API server and the Ray dashboard) is known from one
    TCP connect; where something listens, the HTTP client asks it."""
    import http.server
    import socket
    import threading

    with socket.socket() as closed:  # a port nothing listens on: bound, then closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    refused = modules_after("check", "--config", _config(tmp_path, port), "--only", "vllm,ray")
    assert "dgxdoctor.checks.vllm" in refused and loaded(refused, "httpx") == []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answering = modules_after("check", "--config", _config(tmp_path, server.server_address[1]), "--only", "vllm")
    finally:
        server.shutdown()
    assert loaded(answering, "httpx") == ["httpx"]

"""``promtool check metrics`` (Prometheus's own linter) finds nothing in the exposition: the golden file, which
covers every kind of family the collector emits, and a scrape of a store holding a real peer_compare result."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from conftest import FIXTURES
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.exporters.collector import exposition, make_registry
from dgxdoctor.fleet.store import ResultStore

pytestmark = pytest.mark.integration


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


def test_golden_exposition_is_lint_clean() -> None:
    """What the real gpu and infiniband checks export: dgxdoctor_gpus (was _gpu_count, a summary's suffix) and the
    IB counters in base units (was dgxdoctor_ib_port_counter_total, a name holding its type) lint clean too."""
    done = promtool_check((FIXTURES / "golden" / "daemon_metrics.prom").read_text())
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_peer_compare_exposition_is_lint_clean() -> None:
    store = ResultStore("dgx-a")
    peers = Peers(("http://dgx-b:9835", "http://dgx-c:9835"), None, 1.0)
    env = Environment(
        node="dgx-a",
        http_transport=httpx.MockTransport(lambda r: httpx.Response(401)),
        fleet=Fleet(lambda check: store.snapshot(exclude=(check,)), lambda: peers),
    )
    check = PeerCompareCheck(PeerCompareSettings(), env)
    store.put(check.run())
    done = promtool_check(exposition(make_registry(store)).decode())
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_promtool_would_notice_a_problem() -> None:
    """Proves the checks above can fail: a counter without ``_total`` is reported."""
    done = promtool_check("# HELP bad_counter x\n# TYPE bad_counter counter\nbad_counter 1\n")
    assert "counter metrics should have" in (done.stdout + done.stderr)

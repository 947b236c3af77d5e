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


# The golden file is now what the real gpu and infiniband checks export, and promtool names two families the old
# hand-made golden never held. Both are shipped names (dashboards, docs/metrics.md): renaming them is its own
# change (dgxdoctor_gpu_count -> dgxdoctor_gpus; the IB counters in base units, e.g. _bytes_total for
# port_rcv_data). Any other lint finding fails.
KNOWN_LINT = {
    'dgxdoctor_gpu_count non-histogram and non-summary metrics should not have "_count" suffix',
    "dgxdoctor_ib_port_counter_total metric name should not include type 'counter'",
}


def test_golden_exposition_is_lint_clean() -> None:
    done = promtool_check((FIXTURES / "golden" / "daemon_metrics.prom").read_text())
    found = {line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()}
    assert found <= KNOWN_LINT, done.stdout + done.stderr


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

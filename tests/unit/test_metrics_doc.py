"""docs/metrics.md is generated from the MetricSpecs and lists every family a scrape exports.

After adding a metric: ``PYTHONPATH=src python -m dgxdoctor.exporters.metricsdoc > docs/metrics.md``
(or ``DGXDOCTOR_REWRITE_GOLDEN=1 pytest tests/unit/test_metrics_doc.py``).
"""

from __future__ import annotations

import os

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.exporters.collector import exposition, make_registry
from dgxdoctor.exporters.metricsdoc import all_specs, render
from dgxdoctor.fleet.store import ResultStore

DOC = REPO / "docs" / "metrics.md"


def test_doc_is_generated_from_the_code() -> None:
    text = render()
    if os.environ.get("DGXDOCTOR_REWRITE_GOLDEN"):
        DOC.write_text(text)
    assert DOC.read_text() == text, "docs/metrics.md is stale: regenerate it (see this test's docstring)"


def test_every_scraped_family_is_documented() -> None:
    store = ResultStore("dgx-a")
    env = Environment(
        node="dgx-a",
        http_transport=httpx.MockTransport(lambda r: httpx.Response(503)),
        fleet=Fleet(lambda check: store.snapshot(), lambda: Peers(("http://dgx-b:9835",), None, 1.0)),
    )
    check = PeerCompareCheck(PeerCompareSettings(), env)
    store.put(check.run())
    families = {f.name for f in text_string_to_metric_families(exposition(make_registry(store)).decode())}
    documented = {spec.name.removesuffix("_total") for spec, _ in all_specs()}
    assert families - documented == set()
    doc = DOC.read_text()
    for spec, _ in all_specs():
        assert f"`{spec.name}`" in doc


def test_every_counter_says_how_it_starts() -> None:
    """A new counter must say whether it exists at 0 after a start (an alert's increase() misses a series born at
    its first count), and every line names a counter that exists."""
    from dgxdoctor.exporters.metricsdoc import COLD_START

    counters = {spec.name for spec, _ in all_specs() if spec.type in ("counter", "histogram")}
    assert sorted(counters - set(COLD_START)) == []
    assert sorted(set(COLD_START) - counters) == []


def test_the_documented_series_counts_are_the_code_s() -> None:
    from dgxdoctor.checks.base import probe_labels
    from dgxdoctor.checks.registry import ALL_CHECKS
    from dgxdoctor.exporters.collector import PROBE_TIMEOUTS
    from dgxdoctor.exporters.metricsdoc import COLD_START
    from dgxdoctor.exporters.remediation import ACTIONS_TOTAL
    from dgxdoctor.remediation.engine import ACTION_OUTCOMES

    assert f"({len(ACTION_OUTCOMES)} series)" in COLD_START[ACTIONS_TOTAL.name]
    assert f"({len(ACTION_OUTCOMES)} series)" in ACTIONS_TOTAL.help
    probes = [len(probe_labels(c)) for c in ALL_CHECKS]  # type: ignore[arg-type]
    assert f"({min(probes)}-{max(probes)} series per check, {sum(probes)} with" in COLD_START[PROBE_TIMEOUTS.name]

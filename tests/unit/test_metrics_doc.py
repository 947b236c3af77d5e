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

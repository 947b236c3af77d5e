"""Generate the shipped dashboard JSON from code: ``python -m dgxdoctor.dashboards.generate [--check]``.

Needs the ``dashboards`` extra (grafana-foundation-sdk, typed builders generated from Grafana 11.6's schema).
``--check`` exits 1 when a shipped file differs from what the code generates.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from dgxdoctor.dashboards import DASHBOARDS, overview, serving

BUILDERS: dict[str, Callable[[], dash_b.Dashboard]] = {
    "dgxdoctor-overview.json": overview.build,
    "dgxdoctor-serving.json": serving.build,
}
HERE = Path(__file__).resolve().parent


def _number_panels(doc: dict[str, Any]) -> None:
    """Grafana keys panel state on ``id``: number every panel (rows included) from 1, in order."""
    for number, panel in enumerate(doc.get("panels", []), start=1):
        panel["id"] = number


def canonical(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` decoded into the SDK's typed dashboard model (Grafana's schema) and encoded again.

    The decoder keeps only what the schema defines (per panel type and per query type, once the plugins are
    registered) and fills Grafana's defaults: shipped JSON is a fixed point of this, which a test holds.
    """
    register_default_plugins()
    out: dict[str, Any] = json.loads(json.dumps(Dashboard.from_json(doc), cls=JSONEncoder))
    return out


def render(name: str) -> str:
    """The JSON text of one dashboard, as shipped."""
    model = BUILDERS[name]().build()
    doc: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    _number_panels(doc)
    return json.dumps(canonical(doc), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    assert set(BUILDERS) == set(DASHBOARDS), "generate.BUILDERS and DASHBOARDS name different files"
    check = "--check" in argv
    stale = []
    for name in BUILDERS:
        text = render(name)
        path = HERE / name
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        sys.stderr.write(f"stale: {', '.join(stale)}; run python -m dgxdoctor.dashboards.generate\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

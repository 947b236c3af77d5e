"""The contracts between layers: every finding code a consumer keys on (the table of what follows from a finding,
judge.consequence, which remediation and the alert rules read; the peer comparison; the alert rules) is one a
verdict can emit, and every metric the peer comparison reads is one a check exports.

A code "can be emitted" when a verdict module (judge/, fleet/) spells it or the signature catalog holds it; a
renamed code, or one retyped with a typo, fails here instead of silently never matching in the field.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

from dgxdoctor import checks, codes
from dgxdoctor.alerts.alert_rules import all_alerts
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.fleet.compare import ENGINE_STALL_CODES, RULES
from dgxdoctor.judge.consequence import TABLE as CONSEQUENCES
from dgxdoctor.judge.signatures import load_catalog
from dgxdoctor.result import MetricSpec

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
VERDICT_PACKAGES = ("judge", "fleet")
_CODE_MATCH = re.compile(r'code=~"(?P<codes>[A-Z0-9_|]+)"')


def _spelled_in_verdicts() -> set[str]:
    found: set[str] = set()
    for package in VERDICT_PACKAGES:
        for path in (PACKAGE / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return found


def emittable() -> set[str]:
    return _spelled_in_verdicts() | {sig.code for sig in load_catalog().signatures}


def consumed() -> dict[str, str]:
    """code -> who keys on it."""
    out: dict[str, str] = {}
    for code, follows in CONSEQUENCES.items():
        out[code] = f"consequence {follows.action}/{follows.cure.value}"
    out.update(dict.fromkeys(ENGINE_STALL_CODES, "fleet engine stall"))
    for _, alerts in all_alerts():
        for alert in alerts:
            for match in _CODE_MATCH.finditer(alert.expr):
                out.update(dict.fromkeys(match["codes"].split("|"), f"alert {alert.name}"))
    return out


def test_every_consumed_code_is_one_a_verdict_can_emit() -> None:
    can = emittable()
    assert {code: who for code, who in consumed().items() if code not in can} == {}


def test_every_named_code_is_consumed_and_emittable() -> None:
    """codes.py names contracts only: each constant is read by a consumer and emitted by a verdict."""
    named = {v for k, v in vars(codes).items() if k.isupper() and not k.endswith("_PREFIX")}
    assert named - set(consumed()) == set()
    assert named - emittable() == set()


def test_a_misspelt_code_would_fail() -> None:
    assert "VLLM_DEAD" in emittable() and "VLLM_DAED" not in emittable()


def _exported_specs() -> dict[str, MetricSpec]:
    specs: dict[str, MetricSpec] = {}
    for info in pkgutil.iter_modules(checks.__path__):
        module = importlib.import_module(f"dgxdoctor.checks.{info.name}")
        specs.update({v.name: v for v in vars(module).values() if isinstance(v, MetricSpec)})
    return specs


def test_the_peer_comparison_reads_metrics_the_checks_export() -> None:
    specs = _exported_specs()
    wrong = []
    for rule in RULES:
        spec = specs.get(rule.metric)
        if spec is None:
            wrong.append(f"{rule.key}: no check exports {rule.metric}")
        elif rule.per_rail and not {"device", "port"} <= set(spec.labels):
            wrong.append(f"{rule.key}: {rule.metric} has no device/port labels to compare rails by")
    assert wrong == []


def test_the_peer_comparison_reads_the_vllm_checks_findings() -> None:
    """ENGINE_STALL_CODES are read from the findings of the check named "vllm"."""
    assert "vllm" in {c.name for c in ALL_CHECKS}


def test_the_alert_rules_name_checks_that_exist() -> None:
    names = {c.name for c in ALL_CHECKS}
    used = {m for _, alerts in all_alerts() for a in alerts for m in re.findall(r'check="(\w+)"', a.expr)}
    assert used and used <= names

"""An alert names only label values its metric can carry: a code in ``code=~"A|B"`` that the metric never exports
makes a rule that can never fire for it, silently (``PEER_MP_WORKER_DOWN`` on the log signature counter: it is the
peer comparison's finding; ``RAY_GCS_UNREACHABLE`` on the ray check's findings: it is a log signature).

What each metric can carry: ``dgxdoctor_logs_signature_matches_total{code}`` the codes of the signature catalog
(``data/signatures.toml``, ``judge.signatures``); ``dgxdoctor_check_findings_by_code{check="X",code}`` the codes
spelled in check X's module and the judge and fleet modules it imports (the logs check: the catalog's);
``dgxdoctor_remediation_actions_total{action,outcome}`` the pairs of ``remediation.engine.ACTION_OUTCOMES``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from dgxdoctor import codes
from dgxdoctor.alerts.alert_rules import Alert, all_alerts
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.judge.signatures import signature_codes
from dgxdoctor.remediation.engine import ACTION_OUTCOMES

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
SEARCHED = ("dgxdoctor.checks.", "dgxdoctor.judge.", "dgxdoctor.fleet.")
# Modules that spell every check's codes without emitting them: judge.consequence is the table of what follows from
# each code (every check runner imports it), not a check that finds anything.
NOT_EMITTERS = frozenset({"dgxdoctor.judge.consequence"})
_SELECTOR = re.compile(r"(?P<metric>[a-z_:]+)\{(?P<matchers>[^}]*)\}")
_MATCHER = re.compile(r'(?P<label>\w+)(?P<op>=~|=)"(?P<value>[^"]*)"')
_LITERALS = re.compile(r"[A-Za-z0-9_]+(?:\|[A-Za-z0-9_]+)*")
ALERTS = [a for _, group in all_alerts() for a in group]


def _module_path(module: str) -> Path | None:
    base = PACKAGE.parent / Path(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@functools.cache
def _spelled(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """(the strings and ``codes.X`` values one module spells, the checks/judge/fleet modules it imports)."""
    path = _module_path(module)
    if path is None:
        return frozenset(), frozenset()
    strings: set[str] = set()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "codes":
            strings.add(getattr(codes, node.attr, node.attr))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "dgxdoctor" and any(a.name == "codes" for a in node.names):
                continue
            if node.module == "dgxdoctor.codes":
                strings.update(getattr(codes, a.name, a.name) for a in node.names)
            elif node.module.startswith(SEARCHED):
                imported.add(node.module)
                imported.update(f"{node.module}.{a.name}" for a in node.names)
    return frozenset(strings), frozenset(imported)


def codes_of_check(check: str) -> frozenset[str]:
    """The codes ``dgxdoctor_check_findings_by_code{check=...}`` can carry."""
    if check == "logs":
        return frozenset(signature_codes())
    factory = next(f for f in ALL_CHECKS if f.name == check)
    todo, done, found = [factory.__module__], set(), set()
    while todo:
        module = todo.pop()
        if module in done or module in NOT_EMITTERS:
            continue
        done.add(module)
        strings, imported = _spelled(module)
        found |= strings
        todo += [m for m in imported if _module_path(m) is not None]
    return frozenset(found)


def carried(metric: str, label: str, matchers: dict[str, str]) -> frozenset[str] | None:
    """The values ``label`` of ``metric`` can take where the selector's other matchers hold; None: not known."""
    if metric == "dgxdoctor_logs_signature_matches_total" and label == "code":
        return frozenset(signature_codes())
    if metric == "dgxdoctor_check_findings_by_code" and label == "code" and "check" in matchers:
        return codes_of_check(matchers["check"])
    if metric == "dgxdoctor_remediation_actions_total" and label in ("action", "outcome"):
        return frozenset(pair[0 if label == "action" else 1] for pair in ACTION_OUTCOMES)
    return None


def unreachable(alert: Alert) -> list[str]:
    """``metric{label}: value`` for every value a matcher of the alert names that its metric cannot carry."""
    wrong = []
    for selector in _SELECTOR.finditer(alert.expr):
        matchers = {m["label"]: m["value"] for m in _MATCHER.finditer(selector["matchers"])}
        for label, value in matchers.items():
            if not _LITERALS.fullmatch(value):
                continue  # a real pattern (XID_(8|11)): not a list of values
            can = carried(selector["metric"], label, matchers)
            if can is not None:
                wrong += [f"{selector['metric']}{{{label}}}: {v}" for v in value.split("|") if v not in can]
    return wrong


@pytest.mark.parametrize("alert", ALERTS, ids=[a.name for a in ALERTS])
def test_an_alert_names_only_values_its_metric_carries(alert: Alert) -> None:
    assert unreachable(alert) == []


def test_the_metrics_with_known_values_are_read() -> None:
    """The selectors are found (a rewrite of the expressions would not skip the check above silently)."""
    seen = {m["metric"] for a in ALERTS for m in _SELECTOR.finditer(a.expr)}
    known = {"dgxdoctor_logs_signature_matches_total", "dgxdoctor_check_findings_by_code",
             "dgxdoctor_remediation_actions_total"}  # fmt: skip
    assert known <= seen


def test_a_code_the_metric_cannot_carry_fails() -> None:
    """Today's mistakes, put back: a peer comparison code on the log counter, a log signature on the ray check."""
    logs = Alert("X", 'increase(dgxdoctor_logs_signature_matches_total{code=~"NCCL_TIMEOUT|PEER_MP_WORKER_DOWN"}[5m])',
                 "0s", "critical", "", "")  # fmt: skip
    assert unreachable(logs) == ["dgxdoctor_logs_signature_matches_total{code}: PEER_MP_WORKER_DOWN"]
    ray = Alert("Y", 'dgxdoctor_check_findings_by_code{check="ray",code=~"RAY_GCS_UNREACHABLE|RAY_NODE_DEAD"} > 0',
                "0s", "critical", "", "")  # fmt: skip
    assert unreachable(ray) == ["dgxdoctor_check_findings_by_code{code}: RAY_GCS_UNREACHABLE"]
    failed = Alert("Z", 'dgxdoctor_remediation_actions_total{outcome=~"failed|exploded"}', "0s", "warning", "", "")
    assert unreachable(failed) == ["dgxdoctor_remediation_actions_total{outcome}: exploded"]


def test_the_checks_modules_are_read() -> None:
    assert "RAY_NODE_DEAD" in codes_of_check("ray") and "VLLM_DEAD" in codes_of_check("vllm")
    assert "KERNEL_LINK_DOWN" in codes_of_check("xid") and "RAY_GCS_UNREACHABLE" not in codes_of_check("ray")

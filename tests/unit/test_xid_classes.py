"""One XID table, three readers: the xid check, the generated alert rules and remediation's policy give the same
answer for every XID of the shipped catalog (judge.xid.RESOLUTION_CLASSES is the only place that decides; the
check's finding carries what follows from it, judge.consequence.of_xid, and remediation reads that)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dgxdoctor.alerts.alert_rules import xid_alerts
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.xid import PERSON_ACTIONS, RESOLUTION_CLASSES
from dgxdoctor.remediation.policy import problems_from_results
from dgxdoctor.result import CheckResult, Finding, Status
from dgxdoctor.sources.xid import load_catalog

CATALOG = load_catalog()
SHIPPED = sorted(code for code, entry in CATALOG.xids.items() if not entry.unused)
NOT_IN_CATALOG = 999
_CODES = re.compile(r'code=~"XID_\((?P<codes>[0-9|]+)\)"')
_LEVELS = re.compile(r'status=~"(?P<levels>[a-z|]+)"')


def _verdicts(tmp_path: Path) -> dict[int, Finding]:
    """The real check over a kernel log with each XID once, each on a GPU of its own (no repeats)."""
    lines = [
        f"NVRM: Xid (PCI:0000:{i // 256:02x}:{i % 256:02x}): {code}, pid=4242, name=python3, an error\n"
        for i, code in enumerate([*SHIPPED, NOT_IN_CATALOG], start=1)
    ]
    path = tmp_path / "kern.log"
    path.write_text("".join(lines))
    result = XidCheck(XidSettings(), Environment(node="n1", kmsg_path=path)).run()
    found = {int(f.code.removeprefix("XID_")): f for f in result.findings}
    assert sorted(found) == [*SHIPPED, NOT_IN_CATALOG]
    return found


def _rules() -> dict[int, tuple[str, str, set[str]]]:
    """XID -> (alert, severity, the check statuses it fires on), from the generated rules."""
    out: dict[int, tuple[str, str, set[str]]] = {}
    for alert in xid_alerts():
        codes, levels = _CODES.search(alert.expr), _LEVELS.search(alert.expr)
        assert codes and levels, alert.expr
        for code in codes["codes"].split("|"):
            assert int(code) not in out, f"XID {code} in two alerts"
            out[int(code)] = (alert.name, alert.severity, set(levels["levels"].split("|")))
    return out


def _pages(finding: Finding) -> bool:
    """Remediation's answer to the check's finding: it reads the action the finding carries."""
    problems = problems_from_results([CheckResult("xid", finding.status, "", findings=(finding,))])
    return [p.action for p in problems] == ["page"]


def test_every_resolution_of_the_catalog_has_a_class() -> None:
    assert {e.resolution for e in CATALOG.xids.values()} <= set(RESOLUTION_CLASSES)


def test_the_check_the_rules_and_the_policy_agree_on_every_shipped_xid(tmp_path: Path) -> None:
    verdicts, rules = _verdicts(tmp_path), _rules()
    wrong = []
    for code in SHIPPED:
        finding = verdicts[code]
        status = finding.status.value
        alert = rules.get(code)
        if finding.status is Status.OK:
            rule_ok = alert is None
        else:
            rule_ok = alert is not None and alert[1] == status and status in alert[2]
        page_ok = _pages(finding) is (finding.status is Status.CRITICAL)
        if not (rule_ok and page_ok):
            wrong.append(f"XID {code}: check {status}, rule {alert}, paged {_pages(finding)}")
    assert wrong == []


@pytest.mark.parametrize(("code", "status"), [(48, "critical"), (74, "critical"), (145, "critical"),
                                              (159, "warning"), (78, "critical"), (43, "warning")])  # fmt: skip
def test_the_disagreements_found_in_review(tmp_path: Path, code: int, status: str) -> None:
    """48, 74 and 144-150 need a reset (paged, critical rules); 159 is the application's; 78 pages for real."""
    finding = _verdicts(tmp_path)[code]
    assert finding.status.value == status
    assert _rules()[code][1] == status
    assert _pages(finding) is (status == "critical")


def test_an_xid_the_catalog_does_not_know_is_paged_as_the_check_says(tmp_path: Path) -> None:
    finding = _verdicts(tmp_path)[NOT_IN_CATALOG]
    assert finding.status is Status.CRITICAL and _pages(finding)


def test_every_critical_class_is_a_persons_work() -> None:
    """A critical XID verdict is one no restart cures, so remediation pages it and never restarts for it."""
    for resolution, cls in RESOLUTION_CLASSES.items():
        assert (cls.status is Status.CRITICAL) is (cls.action in PERSON_ACTIONS), resolution

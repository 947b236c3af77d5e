"""One answer per finding code: what follows from a finding (judge.consequence) is what the check reports, what the
alert rules carry to the webhook, and what remediation's policy and hardware gate do, for every code judge/ decides
one for, and for every XID of the shipped catalog. The finding carries it from the check runner to ``/state`` and a
peer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from test_contracts import emittable

from dgxdoctor.alerts.alert_rules import REMEDIATION_ALERTS, kernel_alerts, remediation_alerts, xid_alerts
from dgxdoctor.checks.base import Check, CheckRunner
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import RESET_OR_REBOOT, TABLE, judged, of_code
from dgxdoctor.judge.infiniband import StateVerdict
from dgxdoctor.judge.kernel import RULES as KERNEL_RULES
from dgxdoctor.judge.signatures import load_catalog as load_signatures
from dgxdoctor.judge.xid import xid_class
from dgxdoctor.remediation.hardware_gate import causes
from dgxdoctor.remediation.policy import problems_from_results
from dgxdoctor.result import CheckResult, Cure, Finding, Status
from dgxdoctor.sources.xid import load_catalog as load_xids
from dgxdoctor.validation import validate

_CODES = re.compile(r'code=~"(?P<codes>[A-Z0-9_|]+)"')


def _alert_codes() -> dict[str, tuple[str, str]]:
    """code -> (alert, dgxdoctor_action) of the alerts that remediation acts on."""
    out: dict[str, tuple[str, str]] = {}
    for alert in remediation_alerts():
        action = alert.labels.get("dgxdoctor_action")
        match = _CODES.search(alert.expr)
        if action is None or match is None:
            continue
        for code in match["codes"].split("|"):
            assert code not in out, f"{code} in two remediation alerts"
            out[code] = (alert.name, action)
    return out


def _critical(code: str, check: str) -> CheckResult:
    return CheckResult(check, Status.CRITICAL, "x", (judged(Finding(code, Status.CRITICAL, f"{code} seen")),))


def test_the_table_is_codes_a_verdict_emits_and_never_an_xids() -> None:
    """An XID's or SXID's consequence is decided from its verdict (judge/xid.py), never from its code."""
    assert sorted(set(TABLE) - emittable()) == []
    assert [c for c in TABLE if c.startswith(("XID_", "SXID_"))] == []


def test_the_logs_checks_codes_are_critical_signatures() -> None:
    """A signature's finding has the catalog's severity: only a critical one can ask for anything."""
    signatures = {s.code: s for s in load_signatures().signatures}
    wrong = [
        code
        for code, c in TABLE.items()
        if c.check == "logs" and (code not in signatures or signatures[code].severity is not Status.CRITICAL)
    ]
    assert wrong == []


def test_the_kernels_causes_are_critical_rules_with_an_alert_of_their_own() -> None:
    rules = {r.code: r for r in KERNEL_RULES.values()}
    alerted = " ".join(a.expr for a in kernel_alerts())
    for code, c in TABLE.items():
        if c.check == "xid":
            assert rules[code].status is Status.CRITICAL and f'code="{code}"' in alerted, code


def test_remediation_does_what_the_table_says_for_every_code() -> None:
    """The policy's action and the gate's cause, for the code at CRITICAL; at WARNING nothing follows."""
    wrong = []
    for code, c in sorted(TABLE.items()):
        result = _critical(code, c.check)
        actions = [p.action for p in problems_from_results([result])]
        cause = bool(causes({c.check: result}, "dgx-a"))
        if actions != ([] if c.action == "none" else [c.action]) or cause is not (c.cure is Cure.HARDWARE):
            wrong.append(f"{code}: table {c.action}/{c.cure.value}, policy {actions}, cause {cause}")
        warning = judged(Finding(code, Status.WARNING, "x"))
        if (warning.action, warning.cure) != ("none", Cure.NA):
            wrong.append(f"{code}: a warning asks for {warning.action}/{warning.cure.value}")
    assert wrong == []


def test_a_restart_cures_what_asks_for_a_restart_and_nothing_else() -> None:
    for code, c in TABLE.items():
        assert (c.action in ("restart_vllm", "restart_cluster")) is (c.cure is Cure.RESTART), code


def test_the_alert_rules_carry_the_tables_restarts_to_the_webhook() -> None:
    """Every restart code is in the one alert for its (check, action), with that action; no alert restarts for a
    code the table does not restart for. The head's peer comparison has no alert: remediation reads its finding."""
    alerted = _alert_codes()
    wrong = []
    for code, c in sorted(TABLE.items()):
        want = REMEDIATION_ALERTS.get((c.check, c.action)) if c.cure is Cure.RESTART else None
        got = alerted.get(code)
        if (want is None and got is not None) or (want is not None and got != (want, c.action)):
            wrong.append(f"{code}: table {c.check}/{c.action} wants {want}, the rules say {got}")
        if c.cure is Cure.RESTART and want is None and c.check != "peer_compare":
            wrong.append(f"{code}: a restart with no alert")
    wrong += [f"{code}: alerted, not in the table" for code in alerted if code not in TABLE]
    assert wrong == []


def test_every_shipped_xid_has_one_answer(tmp_path: Path) -> None:
    """The real xid check over each XID: its finding pages exactly when it is critical, is a cause exactly when its
    class is a reset or a reboot, and no restart alert names it; its alert rule has the check's severity."""
    catalog = load_xids()
    shipped = sorted(code for code, entry in catalog.xids.items() if not entry.unused)
    lines = [f"NVRM: Xid (PCI:0000:{i // 256:02x}:{i % 256:02x}): {code}, pid=1, name=python3, x\n"
             for i, code in enumerate(shipped, start=1)]  # fmt: skip
    log = tmp_path / "kern.log"
    log.write_text("".join(lines))
    result = XidCheck(XidSettings(), Environment(node="n1", kmsg_path=log)).run()
    severity = {alert.name: alert.severity for alert in xid_alerts()}
    alerted = _alert_codes()
    wrong = []
    for finding in result.findings:
        code = int(finding.code.removeprefix("XID_"))
        cls = xid_class(code, catalog.xid(code).resolution)
        critical = finding.status is Status.CRITICAL
        paged = [p.action for p in problems_from_results([CheckResult("xid", finding.status, "", (finding,))])]
        cause = bool(causes({"xid": CheckResult("xid", finding.status, "", (finding,))}, "n1"))
        if paged != (["page"] if critical else []) or cause is not (critical and cls.action in RESET_OR_REBOOT):
            wrong.append(f"XID {code}: {finding.status.value}, paged {paged}, cause {cause}")
        if cls.alert and severity[cls.alert] != finding.status.value:
            wrong.append(f"XID {code}: alert {cls.alert} is {severity[cls.alert]}, the check {finding.status.value}")
        if finding.code in alerted:
            wrong.append(f"XID {code}: a restart alert names it")
    assert len(result.findings) == len(shipped) and wrong == []


class _Dead(Check):
    """A check whose verdict is VLLM_DEAD, as judge/vllm.py words it; the runner adds what follows."""

    name: ClassVar[str] = "vllm"

    def run(self) -> CheckResult:
        return CheckResult("vllm", Status.CRITICAL, "dead", (Finding("VLLM_DEAD", Status.CRITICAL, "refused"),))


def test_the_runner_judges_every_finding_and_state_carries_it() -> None:
    env = Environment(node="dgx-a")
    (result,) = CheckRunner(env).run_once_blocking([_Dead(_Dead.settings_model(), env)])
    (finding,) = result.findings
    assert (finding.action, finding.cure) == ("restart_vllm", Cure.RESTART)
    state = ResultsDocument.of("dgx-a", [result], 1.0).state()
    (doc,) = state["checks"][0]["findings"]
    assert (doc["action"], doc["cure"]) == ("restart_vllm", "restart")
    # A peer reads it back through the same validation, as text it does not trust to be one of ours.
    back = validate(ResultsDocument, state).checks[0].findings[0]
    assert (back.action, back.cure) == ("restart_vllm", "restart")


def test_of_code_is_the_table_at_critical_only() -> None:
    assert of_code("VLLM_DEAD", Status.CRITICAL) == TABLE["VLLM_DEAD"]
    assert of_code("VLLM_DEAD", Status.UNKNOWN).action == "none"
    assert of_code("KV_CACHE_HIGH", Status.CRITICAL).action == "none"


def test_the_verdict_shapes_build_their_findings_with_it() -> None:
    """A signature's match and an IB state verdict become findings through judge/ (``finding()``), not by hand."""
    timeout = load_signatures().by_code()["NCCL_TIMEOUT"].finding("vllm.log", "Watchdog caught collective timeout", 3)
    assert (timeout.action, timeout.cure, timeout.message.endswith("(3 lines)")) == (
        "restart_cluster",
        Cure.RESTART,
        True,
    )
    down = StateVerdict("IB_PORT_DOWN", Status.CRITICAL, "mlx5_0/1 down", "check the cable").finding("mlx5_0/1")
    assert (down.subject, down.action, down.cure) == ("mlx5_0/1", "page", Cure.HARDWARE)

"""The node conditions (judge.conditions): every finding code walked through the table, each critical hardware or
fabric code held to a condition of its own, the table held to codes a verdict emits, and the statuses of a
condition for each state of the results. The command against a real daemon: tests/integration/
test_node_conditions.py."""

from __future__ import annotations

import ast
from pathlib import Path

from dgxdoctor import codes
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.judge.conditions import CONDITIONS, OTHER, node_conditions, reason_of, rule_of
from dgxdoctor.judge.consequence import TABLE
from dgxdoctor.judge.kernel import RULES as KERNEL_RULES
from dgxdoctor.judge.signatures import load_catalog as load_signatures
from dgxdoctor.result import CheckResult, Cure, Finding, Status
from dgxdoctor.sources.xid import load_catalog as load_xids

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
# Checks whose critical findings are hardware or fabric faults, whatever the consequence table says of them.
HARDWARE_CHECKS = frozenset({"gpu", "infiniband", "driver_stack", "xid"})
# The logs check's signatures that are a fabric fault (a collective between the nodes failed).
FABRIC_SIGNATURES = frozenset({codes.NCCL_NET_FAILURE, codes.NCCL_NETWORK_ERROR, codes.NCCL_SYSTEM_ERROR,
                               codes.GLOO_SOCKET, codes.NCCL_TIMEOUT})  # fmt: skip


def every_code() -> set[str]:
    """Every finding code the project names: the consequence table, the kernel rules, the log signatures, the
    shipped XIDs, codes.py's contracts."""
    named = {v for k, v in vars(codes).items() if k.isupper() and not k.endswith("_PREFIX")}
    xids = {f"XID_{code}" for code, entry in load_xids().xids.items() if not entry.unused}
    signatures = {s.code for s in load_signatures().signatures}
    return set(TABLE) | {r.code for r in KERNEL_RULES.values()} | signatures | xids | named


def hardware_and_fabric() -> set[str]:
    """The critical hardware and fabric codes: judge/'s hardware causes, the hardware checks' consequences, every
    critical kernel rule, every shipped XID, the IB contracts and the fabric signatures."""
    table = {c for c, row in TABLE.items() if row.cure is Cure.HARDWARE or row.check in HARDWARE_CHECKS}
    kernel = {r.code for r in KERNEL_RULES.values() if r.status is Status.CRITICAL}
    xids = {f"XID_{code}" for code, entry in load_xids().xids.items() if not entry.unused}
    ib = {v for k, v in vars(codes).items() if k.startswith("IB_")}
    return table | kernel | xids | ib | FABRIC_SIGNATURES


def _doc(*results: CheckResult) -> ResultsDocument:
    return ResultsDocument.of("dgx-a", results, 0.0)


def _critical(code: str, check: str = "any") -> CheckResult:
    return CheckResult(check, Status.CRITICAL, "x", (Finding(code, Status.CRITICAL, f"{code} seen", "subj"),))


def test_every_code_critical_sets_exactly_one_condition() -> None:
    wrong = []
    for code in sorted(every_code()):
        found = node_conditions(_doc(_critical(code)))
        true = [c for c in found if c.status == "True"]
        if len(true) != 1 or true[0].type != rule_of(code).type or true[0].reason != reason_of(code):
            wrong.append(f"{code}: {[(c.type, c.reason) for c in true]}")
    assert wrong == []


def test_every_critical_hardware_or_fabric_code_has_a_condition_of_its_own() -> None:
    assert sorted(c for c in hardware_and_fabric() if rule_of(c) is OTHER) == []


def test_the_walk_reaches_the_issues_conditions() -> None:
    types = {rule_of(code).type for code in every_code()}
    assert {"GpuXidCritical", "RdmaPortDown", "NcclRankDead", "ServingGroupStalled", "GpuMissing",
            "DriverMismatch", "DgxdoctorCritical"} <= types  # fmt: skip


def _spelled_by_verdicts() -> set[str]:
    """Strings in the verdict modules (judge/, fleet/) other than the tables that only name codes."""
    tables = {PACKAGE / "judge" / "conditions.py", PACKAGE / "judge" / "consequence.py"}
    found: set[str] = set()
    for package in ("judge", "fleet"):
        for path in (PACKAGE / package).rglob("*.py"):
            if path in tables:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return found


def test_the_table_names_only_codes_a_verdict_emits_and_each_once() -> None:
    emitted = _spelled_by_verdicts() | {s.code for s in load_signatures().signatures} | {
        r.code for r in KERNEL_RULES.values()}  # fmt: skip
    named = [code for rule in CONDITIONS for code in rule.codes]
    assert sorted(set(named) - emitted) == []
    assert sorted(c for c in set(named) if named.count(c) > 1) == []
    types = [r.type for r in (*CONDITIONS, OTHER)]
    assert len(types) == len(set(types))


def test_the_statuses() -> None:
    healthy = node_conditions(_doc(CheckResult("infiniband", Status.OK, "8 rails")))
    assert {c.status for c in healthy} == {"False"}
    ib = CheckResult("infiniband", Status.CRITICAL, "a rail down",
                     (Finding("IB_PORT_DOWN", Status.CRITICAL, "Down", "mlx5_3/1"),
                      Finding("IB_PORT_DOWN", Status.CRITICAL, "Down", "mlx5_5/1")))  # fmt: skip
    gpu_unknown = CheckResult.unknown("gpu", "NVML hung")
    found = {c.type: c for c in node_conditions(_doc(ib, gpu_unknown))}
    rdma = found["RdmaPortDown"]
    assert (rdma.status, rdma.reason) == ("True", "IbPortDown")
    assert rdma.message == "mlx5_3/1: IB_PORT_DOWN: Down; mlx5_5/1: IB_PORT_DOWN: Down"
    # the GPU check cannot say: what it decides is Unknown, never False
    assert found["GpuMissing"].status == "Unknown" and "gpu" in found["GpuMissing"].message
    assert found["DgxdoctorCritical"].status == "Unknown"  # read from every check
    assert found["NcclRankDead"].status == "False"  # the gpu check does not decide it
    warning = CheckResult("infiniband", Status.WARNING, "slow", (Finding("IB_PORT_RATE_LOW", Status.WARNING, "x"),))
    assert {c.status for c in node_conditions(_doc(warning))} == {"False"}  # a warning sets no condition
    none = node_conditions(None, "no daemon")
    assert {(c.status, c.reason) for c in none} == {("Unknown", "DgxdoctorUnavailable")}


def test_reasons_are_camel_case() -> None:
    assert [reason_of(c) for c in ("IB_PORT_DOWN", "XID_79", "SXID_20034")] == ["IbPortDown", "Xid79", "Sxid20034"]


def test_docs_fleet_names_every_condition() -> None:
    page = (PACKAGE.parents[1] / "docs" / "fleet.md").read_text(encoding="utf-8")
    assert [r.type for r in (*CONDITIONS, OTHER) if f"`{r.type}`" not in page] == []


def test_a_peers_fault_is_the_peers_condition() -> None:
    other = Finding("PEER_MP_WORKER_DOWN", Status.CRITICAL, "dgx-b's headless vLLM is not serving", "dgx-b")
    found = {c.type: c.status for c in node_conditions(_doc(CheckResult("peer_compare", Status.CRITICAL, "x",
                                                                        (other,))))}  # fmt: skip
    assert found["ServingGroupStalled"] == "False"
    mine = Finding("PEER_MP_WORKER_DOWN", Status.CRITICAL, "dgx-a's headless vLLM is not serving", "dgx-a")
    found = {c.type: c.status for c in node_conditions(_doc(CheckResult("peer_compare", Status.CRITICAL, "x",
                                                                        (mine,))))}  # fmt: skip
    assert found["ServingGroupStalled"] == "True"

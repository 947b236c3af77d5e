"""``slurm-health``'s parts: Slurm's node record as scontrol prints it (real captures, tests/fixtures/slurm), the
drain reason, and what is done to the record for each state of the daemon's results. The whole command against a
real slurmctld/slurmd and daemon: tests/integration/test_slurm_drain.py."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.remediation.slurm_drain import drain_reason, plan
from dgxdoctor.result import CheckResult, Cure, Finding, Status
from dgxdoctor.sources.commands import CommandResult
from dgxdoctor.sources.slurm import ScontrolError, SlurmNode, parse_show_node, show_node

SLURM = FIXTURES / "slurm"


def test_the_records_scontrol_prints() -> None:
    idle = parse_show_node((SLURM / "show_node_idle.txt").read_text())
    assert (idle.name, idle.state, idle.reason, idle.drained) == ("dgxd-node1", "IDLE", None, False)
    ours = parse_show_node((SLURM / "show_node_drained.txt").read_text())
    assert ours.drained and ours.reason == "dgxdoctor:XID_79:0000:3b:00.0" and ours.reason_by == "root"
    operator = parse_show_node((SLURM / "show_node_operator_drain.txt").read_text())
    assert operator.drained and operator.reason == "maintenance window [ticket 42]"


def test_scontrols_refusal_is_its_own_words() -> None:
    def run(argv: object, timeout_s: float = 10.0) -> CommandResult:
        return CommandResult(("scontrol",), 1, "Node nosuchnode not found\n \n", "")

    with pytest.raises(ScontrolError, match="Node nosuchnode not found"):
        show_node(run, "nosuchnode", 5.0)


@pytest.mark.parametrize(
    ("code", "subject", "reason"),
    [
        ("IB_PORT_DOWN", "mlx5_3/1", "dgxdoctor:IB_PORT_DOWN:mlx5_3/1"),
        ("XID_79", "0000:3b:00.0", "dgxdoctor:XID_79:0000:3b:00.0"),
        ("VLLM_DEAD", None, "dgxdoctor:VLLM_DEAD:node"),
        # a subject is data from the world: no spaces, quotes, newlines or brackets reach Slurm's reason
        ("X", 'gpu "3"\n[root@x] ; rm -rf /', "dgxdoctor:X:gpu__3___root@x____rm_-rf_/"),
        ("A:B C", "", "dgxdoctor:A_B_C:node"),
    ],
)
def test_the_drain_reason(code: str, subject: str | None, reason: str) -> None:
    assert drain_reason(code, subject) == reason


def test_the_drain_reason_is_bounded() -> None:
    reason = drain_reason("C" * 500, "s" * 500)
    assert len(reason) <= len("dgxdoctor:") + 48 + 1 + 96 and reason.count(":") == 2


def _doc(*results: CheckResult) -> ResultsDocument:
    return ResultsDocument.of("dgx-a", results, 0.0)


OK = CheckResult("gpu", Status.OK, "8 GPUs")
RAIL_DOWN = Finding("IB_PORT_DOWN", Status.CRITICAL, "mlx5_3/1 Down", "mlx5_3/1", cure=Cure.HARDWARE)
IB_DOWN = CheckResult("infiniband", Status.CRITICAL, "a rail down", (RAIL_DOWN,))
VLLM_DEAD = CheckResult("vllm", Status.CRITICAL, "refused", (Finding("VLLM_DEAD", Status.CRITICAL, "refused"),))
RAY_UNKNOWN = CheckResult.unknown("ray", "timed out")
IDLE = SlurmNode("dgxd-node1", "IDLE")
OURS = SlurmNode("dgxd-node1", "IDLE+DRAIN", "dgxdoctor:IB_PORT_DOWN:mlx5_3/1", "root")
OPERATOR = SlurmNode("dgxd-node1", "MIXED+DRAIN", "bad DIMM", "admin")


def test_a_critical_drains_naming_the_hardware_fault_first() -> None:
    decided = plan(_doc(VLLM_DEAD, IB_DOWN), IDLE)
    assert (decided.verb, decided.reason) == ("drain", "dgxdoctor:IB_PORT_DOWN:mlx5_3/1")
    assert "1 more" in decided.why


def test_a_drain_of_ours_follows_the_finding_and_is_lifted_when_it_clears() -> None:
    assert plan(_doc(IB_DOWN), OURS).verb == "none"  # already so
    assert plan(_doc(VLLM_DEAD), OURS).reason == "dgxdoctor:VLLM_DEAD:node"  # another finding now: its reason
    assert plan(_doc(OK), OURS).verb == "resume"


def test_an_unknown_check_keeps_our_drain() -> None:
    decided = plan(_doc(OK, RAY_UNKNOWN), OURS)
    assert decided.verb == "none" and "ray" in decided.why


def test_an_operators_drain_is_never_touched() -> None:
    assert plan(_doc(IB_DOWN), OPERATOR).verb == "none"
    assert plan(_doc(OK), OPERATOR).verb == "none"


def test_a_healthy_node_is_left_as_it_is() -> None:
    assert plan(_doc(OK), IDLE).verb == "none"
    assert plan(_doc(OK, RAY_UNKNOWN), IDLE).verb == "none"  # unknown is not critical: no drain


def test_a_peers_fault_drains_the_peer_not_this_node() -> None:
    """The peer comparison names the node whose rank stopped: that node's record, not ours."""
    other = Finding("PEER_TP_RANK_STOPPED", Status.CRITICAL, "dgx-b's GPUs idle", "dgx-b")
    assert plan(_doc(CheckResult("peer_compare", Status.CRITICAL, "x", (other,))), IDLE).verb == "none"
    assert plan(_doc(CheckResult("peer_compare", Status.CRITICAL, "x", (other,))), OURS).verb == "resume"
    mine = Finding("PEER_TP_RANK_STOPPED", Status.CRITICAL, "dgx-a's GPUs idle", "dgx-a")
    decided = plan(_doc(CheckResult("peer_compare", Status.CRITICAL, "x", (mine,))), IDLE)
    assert decided.reason == "dgxdoctor:PEER_TP_RANK_STOPPED:dgx-a"

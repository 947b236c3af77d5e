"""A peer's findings reach the comparison whole, through the validation the daemon uses.

Each worker document here is built as the worker's daemon builds its ``/state`` (``ResultsDocument.of`` over real
check results), sent as JSON bytes over HTTP (an httpx transport at the network boundary), fetched and validated
by ``fleet/peers.py`` and compared by the head's ``peer_compare`` check, exactly as in the daemon; ``check
--cluster`` and the status page go through ``fleet/cluster.assemble``, tested the same way. Before the fix the
validation kept only each check's name, status and samples: ``PEER_MP_WORKER_DOWN``, ``PEER_TP_RANK_STOPPED``,
``PEER_HARDWARE_FAULT`` and the stuck rank's NCCL words never arrived (issue 34).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from dgxdoctor import codes
from dgxdoctor.checks.gpu import UTILIZATION
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.checks.ras import RasCheck, RasSettings
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck, VllmExecutorSettings
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.documents import MAX_TEXT, ResultsDocument
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.fleet.cluster import NodeRun, assemble, cluster_document
from dgxdoctor.fleet.peers import BadAnswer, response_json, validate_state, validated_document
from dgxdoctor.judge.consequence import judged_result
from dgxdoctor.judge.hardware_cause import peer_cause_findings
from dgxdoctor.judge.vllm import Observed, progress_finding
from dgxdoctor.remediation.guard import Decision
from dgxdoctor.remediation.hardware_gate import HardwareGate, causes
from dgxdoctor.remediation.policy import problems_from_results
from dgxdoctor.result import CheckResult, Sample, Status
from dgxdoctor.sources.vllm_metrics import parse_vllm_metrics
from dgxdoctor.validation import validate
from proctree import write_process
from ras_standin import CLOSE, scripted

WORKER_URL = "http://dgx-b:9835"
TOKEN = "peer-findings-token-0123456789"
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
SXID_FATAL = "nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 12028, Fatal, Link 44 egress non-posted PRIV error"
RAS = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
VLLM = ("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "8",
        "--pipeline-parallel-size", "2")  # fmt: skip
STALLED_METRICS = (
    'vllm:num_requests_running{engine="0",model_name="tiny"} 4.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0\n'
    'vllm:generation_tokens_total{engine="0",model_name="tiny"} 1200.0\n'
)


def wire(node: str, results: list[CheckResult]) -> bytes:
    """The node's /state as its daemon answers it: the results store's document (each result as the check runner
    stores it, with what follows from each finding: judge.consequence), as JSON bytes."""
    judged = [judged_result(r) for r in results]
    return json.dumps(ResultsDocument.of(node, judged, time.time()).state()).encode()


def head_peer_compare(head: list[CheckResult], worker: list[CheckResult]) -> CheckResult:
    """The head's peer_compare check as the daemon runs it: its own /state document, the worker's fetched over
    HTTP with the token and validated by fleet/peers.py."""
    body = wire("dgx-b", worker)

    def serve(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/state" and request.headers["authorization"] == f"Bearer {TOKEN}"
        return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})

    local = ResultsDocument.of("dgx-a", [judged_result(r) for r in head], time.time()).state()
    fleet = Fleet(local_state=lambda without: local, peers=lambda: Peers((WORKER_URL,), TOKEN, 5.0))
    env = Environment(node="dgx-a", http_transport=httpx.MockTransport(serve), one_shot=False, fleet=fleet)
    return judged_result(PeerCompareCheck(validate(PeerCompareSettings, {}), env).run())


def cluster_findings(head: list[CheckResult], worker: list[CheckResult]) -> list[dict[str, Any]]:
    """`check --cluster`'s comparison (and the status page's "Between the nodes"): both documents validated."""
    local = NodeRun("dgx-a", None, ResultsDocument.of("dgx-a", head, time.time()).state())
    peer_doc = validated_document(response_json(wire("dgx-b", worker))).state()
    view = assemble(local, [NodeRun("dgx-b", WORKER_URL, peer_doc)])
    findings: list[dict[str, Any]] = cluster_document(view)["comparison"]["findings"]
    return findings


def headless_missing(tmp_path: Path) -> CheckResult:
    """The worker's vllm_executor check on an mp worker node with no headless vLLM process."""
    proc = tmp_path / "proc"
    proc.mkdir()
    env = Environment(node="dgx-b", role="worker", executor="mp", proc_root=proc)
    return VllmExecutorCheck(VllmExecutorSettings(), env).run()


def kernel_log(tmp_path: Path, *lines: str) -> CheckResult:
    """The worker's xid check on its kernel log holding ``lines``."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("".join(f"{line}\n" for line in lines))
    return XidCheck(XidSettings(), Environment(node="dgx-b", kmsg_path=kmsg)).run()


def gpus(util: float) -> CheckResult:
    samples = tuple(Sample(UTILIZATION, util, {"gpu": str(i), "pci_bus_id": f"0000:{i:02x}:00"}) for i in range(8))
    return CheckResult("gpu", Status.OK, "8 GPUs", samples=samples)


def stalled_engine() -> CheckResult:
    """A vllm check that sees requests running and no token counted for 20 s (judge/vllm.py's verdict)."""
    seen = Observed(parse_vllm_metrics(STALLED_METRICS), None, None, 20.0, None, None)
    finding = progress_finding(seen, 15.0, "http://127.0.0.1:8000")
    assert finding is not None and finding.code == codes.ENGINE_HUNG
    return CheckResult("vllm", Status.CRITICAL, "engine hung", (finding,))


def codes_of(result: CheckResult) -> list[tuple[str, str | None]]:
    return [(f.code, f.subject) for f in result.findings]


def test_a_worker_whose_headless_vllm_is_gone_is_named_by_the_head_and_restarts_the_cluster(tmp_path: Path) -> None:
    executor = headless_missing(tmp_path)
    assert [f.code for f in executor.findings] == ["VLLM_MP_HEADLESS_MISSING"]
    result = head_peer_compare([], [executor])
    assert "1/1 peer(s) answered" in result.summary
    down = [f for f in result.findings if f.code == "PEER_MP_WORKER_DOWN"]
    assert len(down) == 1 and down[0].status is Status.CRITICAL and down[0].subject == "dgx-b", result.findings
    assert "no headless vLLM process on this worker node" in down[0].message
    (problem,) = problems_from_results([result])
    assert problem.action == "restart_cluster" and problem.reason.startswith("PEER_MP_WORKER_DOWN dgx-b: ")
    assert [f["code"] for f in cluster_findings([], [executor])] == ["PEER_MP_WORKER_DOWN"]


def test_a_worker_rank_stopped_under_a_stalled_engine_is_named_by_the_head() -> None:
    """The worker's vllm check (watching the head's API server) sees the stall, its GPUs idle; the head's spin."""
    result = head_peer_compare([gpus(1.0)], [stalled_engine(), gpus(0.0)])
    stopped = [f for f in result.findings if f.code == "PEER_TP_RANK_STOPPED"]
    assert len(stopped) == 1 and stopped[0].subject == "dgx-b", result.findings
    assert "vLLM's engine is stalled (dgx-b): dgx-b's GPUs are idle (0%) while dgx-a 100% spin" in stopped[0].message
    # The head's own stall and the worker's idle GPUs: `check --cluster` validates the head's document too.
    in_cluster = cluster_findings([stalled_engine(), gpus(1.0)], [gpus(0.0)])
    assert [f["subject"] for f in in_cluster if f["code"] == "PEER_TP_RANK_STOPPED"] == ["dgx-b"], in_cluster


def test_a_workers_xid_79_is_a_peer_hardware_fault_that_refuses_the_restart(tmp_path: Path) -> None:
    xid = kernel_log(tmp_path, XID_79)
    assert [(f.code, f.status) for f in xid.findings] == [("XID_79", Status.CRITICAL)]
    state = validate_state(response_json(wire("dgx-b", [xid])))
    assert state["checks"][0]["findings"][0]["evidence"] == XID_79
    assert [f.message for f in peer_cause_findings(state, "dgx-b:9835")] == ["XID 79 on 0000:3b:00 of dgx-b"]

    result = head_peer_compare([], [headless_missing(tmp_path), xid])
    faults = [f for f in result.findings if f.code == "PEER_HARDWARE_FAULT"]
    assert [(f.status, f.subject, f.message) for f in faults] == [
        (Status.WARNING, "dgx-b:9835", "XID 79 on 0000:3b:00 of dgx-b")
    ]
    # The hardware gate reads it from the peer_compare result: the cluster restart is refused, naming the XID.
    (problem,) = problems_from_results([result])
    restart = Decision("act", "restart_cluster", "ready", problem)
    decided, pages = HardwareGate().apply([restart], causes({"peer_compare": result}, "dgx-a"), "dgx-a")
    assert decided[0].verdict == "refuse" and "cause: XID 79 on 0000:3b:00 of dgx-b" in decided[0].reason
    assert len(pages) == 1


def test_a_workers_fatal_sxid_counts_only_with_its_kernel_line(tmp_path: Path) -> None:
    """Whether an SXID is fatal is in its line, not its code: the evidence must arrive with the finding."""
    sxid = kernel_log(tmp_path, SXID_FATAL)
    assert [(f.code, f.status) for f in sxid.findings] == [("SXID_12028", Status.CRITICAL)]
    state = validate_state(response_json(wire("dgx-b", [sxid])))
    assert [f.message for f in peer_cause_findings(state, "dgx-b")] == ["SXID 12028 on 0000:86:00.0 of dgx-b"]


def test_the_stuck_rank_carries_the_reporting_peers_nccl_words(tmp_path: Path) -> None:
    """NCCL's RAS seen from the worker (its ras check read the stall report): the head's joined finding quotes
    NCCL's own words from the worker's findings."""
    write_process(tmp_path, 4242, "python3", VLLM)
    script = [b"SERVER PROTOCOL 2\n", b"OK\n", b"OK\n", (RAS / "stall_rank11.json").read_bytes() + CLOSE]
    with scripted(script) as server:
        ras = RasCheck(validate(RasSettings, {"address": f"127.0.0.1:{server.port}", "deadline_s": 3}),
                       Environment(node="dgx-b", proc_root=tmp_path)).run()  # fmt: skip
    assert any("; NCCL: " in f.message for f in ras.findings), ras.findings
    result = head_peer_compare([], [ras])
    stuck = [f for f in result.findings if f.code == "PEER_TP_RANK_STUCK"]
    assert len(stuck) == 1, result.findings
    assert "NCCL: communicator 0x7f3a9e0c21d4b6a1: missing rank 11" in stuck[0].message


def test_a_peers_finding_is_bounded_not_refused() -> None:
    """A peer is untrusted: its words are cut to MAX_TEXT, a document with too many findings is refused."""
    long = {"code": "X" * 10_000, "status": "critical", "subject": "s" * 10_000, "message": "m" * 100_000,
            "evidence": "e" * 100_000, "remedy": "r" * 100_000, "newer_field": 1}  # fmt: skip
    state = validate_state({"node": "dgx-b", "checks": [{"name": "logs", "findings": [long]}]})
    kept = state["checks"][0]["findings"][0]
    assert len(kept["code"]) == len(kept["subject"]) == 256
    assert len(kept["message"]) == len(kept["evidence"]) == len(kept["remedy"]) == MAX_TEXT
    assert "newer_field" not in kept
    many = [{"code": "X", "status": "warning"}] * 2_001
    try:
        validate_state({"node": "dgx-b", "checks": [{"name": "logs", "findings": many}]})
    except BadAnswer as exc:
        assert "more than 2000 findings" in str(exc)
    else:
        raise AssertionError("2,001 findings accepted")


def test_a_peer_that_gives_no_state_keeps_its_last_hardware_cause(tmp_path: Path) -> None:
    """The worker's agent restarting (or its node rebooting) while its GPU is off the bus: its causes are unknown,
    not gone. The head's peer_compare keeps relaying the XID its last answer carried until the worker answers
    again, so the head does not restart vLLM meanwhile (found by benchmarks/replay.py: before, the head restarted
    vLLM and then the cluster the moment the worker's agent restarted during an XID 79)."""
    answers = [wire("dgx-b", [kernel_log(tmp_path, XID_79)]), None, wire("dgx-b", [])]

    def serve(request: httpx.Request) -> httpx.Response:
        body = answers[0]
        if body is None:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})

    local = ResultsDocument.of("dgx-a", [], time.time()).state()
    fleet = Fleet(local_state=lambda without: local, peers=lambda: Peers((WORKER_URL,), TOKEN, 5.0))
    env = Environment(node="dgx-a", http_transport=httpx.MockTransport(serve), one_shot=False, fleet=fleet)
    check = PeerCompareCheck(validate(PeerCompareSettings, {}), env)  # one instance, as the daemon keeps it
    seen = []
    for _ in range(3):
        result = judged_result(check.run())
        seen.append([(f.code, f.message) for f in result.findings])
        answers.pop(0)
        if len(seen) == 2:
            (cause,) = causes({"peer_compare": result}, "dgx-a")
            assert cause.text == "XID 79 on 0000:3b:00 of dgx-b"
            assert "gave no state now" in (cause.finding.evidence or "")
    assert seen[0] == [("PEER_HARDWARE_FAULT", "XID 79 on 0000:3b:00 of dgx-b")]
    assert [code for code, _ in seen[1]] == ["PEER_UNREACHABLE", "PEER_HARDWARE_FAULT"]
    assert seen[1][1] == seen[0][0]  # the same cause: the gate's page for it is not sent again
    assert seen[2] == []  # the worker answered without it: gone

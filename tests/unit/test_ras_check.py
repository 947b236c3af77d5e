"""The ras check: NCCL's RAS read through a stand-in server on loopback, vLLM's processes laid out under a proc root."""

from __future__ import annotations

import csv
import socket
import time
from pathlib import Path
from typing import Any

from dgxdoctor.checks.ras import RasCheck, RasSettings, parallel_size
from dgxdoctor.documents import CheckDoc
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.compare import compare
from dgxdoctor.fleet.peers import validate_state
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.validation import validate
from proctree import write_process
from ras_standin import CLOSE, scripted

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
HANG = Path(__file__).resolve().parents[2] / "docs" / "h200" / "hang-recording-2026-11-30" / "hang.csv"
HELLO, OK = b"SERVER PROTOCOL 2\n", b"OK\n"
VLLM = ("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "8",
        "--pipeline-parallel-size", "2")  # fmt: skip


def vllm_proc(root: Path, pid: int = 4242, environ: dict[str, str] | None = None, argv: tuple[str, ...] = VLLM) -> None:
    d = write_process(root, pid, "python3", argv)
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (environ or {}).items()))


def nccl_proc(root: Path, pid: int, ras_addr: str | None = None) -> None:
    d = write_process(root, pid, "python3", ("python3", "worker.py"))
    (d / "environ").write_bytes(f"NCCL_RAS_ADDR={ras_addr}\0".encode() if ras_addr else b"")


def run(tmp_path: Path, port: int | None, **settings: Any) -> CheckResult:
    if port is not None:
        settings.setdefault("address", f"127.0.0.1:{port}")
    settings.setdefault("deadline_s", 3)
    check = RasCheck(validate(RasSettings, settings), Environment(node="dgx-a", proc_root=tmp_path))
    return check.run()


def report(name: str) -> list[bytes]:
    fmt = OK if name.endswith(".json") else b"ERROR: Unknown command SET FORMAT json\n"
    return [HELLO, OK, fmt, (FIXTURES / name).read_bytes() + CLOSE]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_healthy_world_exported_as_facts_and_samples(tmp_path: Path) -> None:
    vllm_proc(tmp_path)
    with scripted(report("healthy_2x8.json")) as server:
        result = run(tmp_path, server.port)
    assert result.status is Status.OK, result.findings
    assert result.facts == {"ras.communicator_size": "16", "ras.communicator_nodes": "2", "ras.ranks_per_node": "8"}
    values = {(s.metric.name, s.labels.get("bound", "")): s.value for s in result.samples}
    assert values[("dgxdoctor_ras_communicator_ranks", "")] == 16
    assert values[("dgxdoctor_ras_communicator_ranks_per_node", "min")] == 8


def test_communicator_smaller_than_tp_times_pp(tmp_path: Path) -> None:
    vllm_proc(tmp_path, argv=(*VLLM[:4], "16", *VLLM[5:]))  # TP 16 x PP 2 = 32 > 16
    with scripted(report("healthy_2x8.txt")) as server:
        result = run(tmp_path, server.port)
    assert [(f.code, f.status) for f in result.findings] == [("RAS_COMMUNICATOR_SMALL", Status.CRITICAL)]
    assert "16 rank(s) over 2 node(s), fewer than the 32" in result.findings[0].message


def test_stall_names_rank_gpu_process_with_ncclS_words(tmp_path: Path) -> None:
    vllm_proc(tmp_path)
    with scripted(report("stall_rank11.txt")) as server:
        result = run(tmp_path, server.port)
    found = {f.code: f for f in result.findings}
    f = found["RAS_RANK_UNRESPONSIVE"]
    assert f.status is Status.CRITICAL and f.subject == "rank 11"
    assert f.message.startswith("rank 11 (GPU 3, process 48213 on 10.0.0.2) unresponsive to NCCL's RAS since ")
    assert "Rank 11 -- GPU 3 managed by process 48213 on node 10.0.0.2" in f.message
    assert "also rank(s) 3 of other communicators" in f.message
    since = [s for s in result.samples if s.metric.name == "dgxdoctor_ras_rank_problem_since_timestamp_seconds"]
    assert [(s.labels["kind"], s.labels["rank"], s.labels["pid"]) for s in since] == [("unresponsive", "11", "48213")]


def test_ras_unreachable_while_vllm_serves(tmp_path: Path) -> None:
    vllm_proc(tmp_path)
    result = run(tmp_path, free_port())
    assert [(f.code, f.status) for f in result.findings] == [("RAS_UNREACHABLE", Status.WARNING)]
    assert any(s.metric.name == "dgxdoctor_ras_up" and s.value == 0 for s in result.samples)


def test_no_vllm_no_ras_is_skipped_unless_required(tmp_path: Path) -> None:
    port = free_port()
    assert run(tmp_path, port).status is Status.SKIPPED
    assert run(tmp_path, port, required=True).findings[0].code == "RAS_UNREACHABLE"


def test_ras_that_accepts_but_never_answers(tmp_path: Path) -> None:
    vllm_proc(tmp_path)

    def stopped(conn: socket.socket) -> None:
        time.sleep(4)

    with scripted([stopped]) as server:
        result = run(tmp_path, server.port, deadline_s=1)  # silent: the whole deadline is waited
    assert [(f.code, f.status) for f in result.findings] == [("RAS_SILENT", Status.CRITICAL)]


def test_nccl_ras_addr_of_the_serving_process_is_honoured(tmp_path: Path) -> None:
    with scripted(report("healthy_2x8.txt")) as server:
        vllm_proc(tmp_path, environ={"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"})
        result = run(tmp_path, None)
    assert result.status is Status.OK and result.facts["ras.communicator_size"] == "16"
    assert f"127.0.0.1:{server.port} (NCCL_RAS_ADDR of pid 4242)" in result.summary or server.connections == 1


def test_bad_address_in_config_is_named() -> None:
    try:
        validate(RasSettings, {"address": "dgx-a:99999"})
    except ValueError as exc:
        assert "port '99999' is not a TCP port" in str(exc)
    else:
        raise AssertionError("accepted a bad port")


def test_parallel_sizes_from_vllm_argv() -> None:
    assert parallel_size(("vllm", "serve", "m", "-tp=16"), "--tensor-parallel-size", "-tp") == 16
    assert parallel_size(("vllm", "serve", "m"), "--tensor-parallel-size", "-tp") is None
    assert parallel_size(("vllm", "serve", "m", "-tp", "\u00b2"), "--tensor-parallel-size", "-tp") is None


def test_handshake_with_a_superscript_version_is_a_finding_naming_the_line(tmp_path: Path) -> None:
    """A server answering "SERVER PROTOCOL \u00b2" was an uncaught ValueError (UNKNOWN, a traceback as message)."""
    vllm_proc(tmp_path)
    with scripted(["SERVER PROTOCOL \u00b2\n".encode() + CLOSE]) as server:
        result = run(tmp_path, server.port)
    assert [(f.code, f.status) for f in result.findings] == [("RAS_UNREACHABLE", Status.WARNING)]
    message = result.findings[0].message
    assert "handshake answered 'SERVER PROTOCOL \u00b2'" in message and "Traceback" not in message
    assert "ValueError" not in result.summary


def test_report_with_a_number_python_will_not_convert_is_unreadable(tmp_path: Path) -> None:
    vllm_proc(tmp_path)
    text = b"DEAD\n  Process " + b"7" * 5000 + b" on node 10.0.0.2 managing GPU 3\n"
    with scripted([HELLO, OK, b"ERROR: Unknown command SET FORMAT json\n", text + CLOSE]) as server:
        result = run(tmp_path, server.port)
    assert [(f.code, f.status) for f in result.findings] == [("RAS_REPORT_UNREADABLE", Status.UNKNOWN)]
    assert "cannot be read" in result.findings[0].message


# -- the joined finding: RAS (a real run of the check on the stand-in) + GPUs (the H200 hang recording) ----------


def hang_gpu(role: str) -> dict[str, float]:
    """A sample of the H200 recording after SIGSTOP: the waiting or the stopped rank's GPU."""
    rows = [r for r in csv.DictReader(HANG.open()) if r["phase"] == "after_stop" and r["role"] == role]
    row = rows[len(rows) // 2]
    return {"util": float(row["util_gpu_pct"]) / 100, "mem": float(row["util_mem_pct"]) / 100,
            "power": float(row["power_w"])}  # fmt: skip


def gpu_check(gpus: dict[int, dict[str, float]]) -> dict[str, Any]:
    names = {"util": "dgxdoctor_gpu_utilization_ratio", "mem": "dgxdoctor_gpu_memory_utilization_ratio",
             "power": "dgxdoctor_gpu_power_watts"}  # fmt: skip
    samples = [{"name": names[k], "labels": {"gpu": str(i), "pci_bus_id": f"0000:{i:02x}:00.0"}, "value": v}
               for i, g in gpus.items() for k, v in g.items()]  # fmt: skip
    return {"name": "gpu", "samples": samples, "findings": []}


def node(name: str, *checks: dict[str, Any]) -> dict[str, Any]:
    return {"node": name, "checks": list(checks), "facts": {}}


def doc(result: CheckResult) -> dict[str, Any]:
    return CheckDoc.of(result).dumped()


def ib_down(device: str) -> dict[str, Any]:
    labels = {"device": device, "port": "1"}
    return {"name": "infiniband", "started_at": 1764590588.0,
            "samples": [{"name": "dgxdoctor_ib_port_up", "labels": labels, "value": 0.0}], "findings": []}  # fmt: skip


def stall_snapshots(tmp_path: Path, b_gpu3: dict[str, float]) -> list[dict[str, Any]]:
    vllm_proc(tmp_path)
    with scripted(report("stall_rank11.json")) as server:
        ras_a = run(tmp_path, server.port)
    waiting = hang_gpu("waiting")
    ras_b = {"name": "ras", "samples": [{"name": "dgxdoctor_ras_local_rank_info", "value": 1.0, "labels": {
        "rank": "11", "host": "10.0.0.2", "pid": "48213", "gpu": "3", "nvml_gpu": "3"}}], "findings": []}  # fmt: skip
    gpus_b = {i: (b_gpu3 if i == 3 else waiting) for i in range(8)}
    peer = node("dgx-b", ras_b, gpu_check(gpus_b), ib_down("mlx5_3"))
    # dgx-b as the head receives it: its /state validated as fleet/peers.py does
    return [node("dgx-a", doc(ras_a), gpu_check(dict.fromkeys(range(8), waiting))), validate_state(peer)]


def test_joined_finding_names_node_gpu_rail(tmp_path: Path) -> None:
    out = compare(stall_snapshots(tmp_path, hang_gpu("stopped")))
    stuck = [f for f in out.findings if f.code == "PEER_TP_RANK_STUCK"]
    assert len(stuck) == 1 and stuck[0].status is Status.CRITICAL
    msg = stuck[0].message
    assert msg.startswith("rank 11 on dgx-b, GPU 3, unresponsive since ")
    assert "dgx-b's GPU 3 idle (0%), as a stopped rank's" in msg
    assert "dgx-a's GPUs spin in the collective, waiting for it" in msg
    assert "dgx-b mlx5_3/1 link down (seen " in msg  # when: the rails check's start, on the node that saw it
    assert "disagree" not in msg and "NCCL: communicator 0x7f3a9e0c21d4b6a1: missing rank 11" in msg
    assert "PEER_TP_RANK_STOPPED" not in {f.code for f in out.findings}


def test_joined_finding_says_when_the_views_disagree(tmp_path: Path) -> None:
    out = compare(stall_snapshots(tmp_path, hang_gpu("waiting")))
    msg = next(f.message for f in out.findings if f.code == "PEER_TP_RANK_STUCK")
    assert "the views disagree: dgx-b's GPU 3 spins like a waiting rank's (100%, memory 0%)" in msg


def test_single_rank_vllm_without_ras_is_skipped(tmp_path: Path) -> None:
    """vLLM on one GPU (or the CPU build) opens no NCCL communicator: no RAS is expected."""
    vllm_proc(tmp_path, argv=("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"))
    assert run(tmp_path, free_port()).status is Status.SKIPPED


def test_local_ranks_are_the_processes_reading_this_ras(tmp_path: Path) -> None:
    """Two agents on one host: a rank is this node's when its process reads RAS at this agent's address."""
    with scripted(report("healthy_2x8.json")) as server:
        nccl_proc(tmp_path, 51011, f"127.0.0.1:{server.port}")
        nccl_proc(tmp_path, 51003, "127.0.0.1:28038")
        result = run(tmp_path, server.port, required=True)
    local = [s.labels for s in result.samples if s.metric.name == "dgxdoctor_ras_local_rank_info"]
    assert local == [{"rank": "11", "host": "10.0.0.2", "pid": "51011", "gpu": "3", "nvml_gpu": "3"}]


def test_nodes_seeing_different_communicators_is_drift() -> None:
    a = {"node": "dgx-a", "checks": [], "facts": {"ras.communicator_size": "16"}}
    b = {"node": "dgx-b", "checks": [], "facts": {"ras.communicator_size": "8"}}
    assert [f.code for f in compare([a, b]).findings] == ["PEER_RAS_VIEW_DRIFT"]


RECORDED = Path(__file__).resolve().parents[2] / "docs" / "h200" / "ras-2026-12-01" / "raw" / "one-rank-sessions.json"


def test_recorded_healthy_job_exported_and_checked_against_the_layout(tmp_path: Path) -> None:
    """The H200 recording (NCCL 2.28.9, one rank) replayed: its size is a fact; against TP 2 it is too small."""
    import json

    from ras_standin import replay

    session = json.loads(RECORDED.read_text())["json"]
    with replay(session) as server:
        ok = run(tmp_path, server.port, required=True)
    with replay(session) as server:
        small = run(tmp_path, server.port, required=True, tensor_parallel_size=2)
    assert ok.status is Status.OK and ok.facts["ras.communicator_size"] == "1", ok.findings
    assert "RAS (2.28.9, json): 1 ranks over 1 node(s)" in ok.summary
    assert [f.code for f in small.findings] == ["RAS_COMMUNICATOR_SMALL"]


def test_the_node_whose_own_ras_went_silent_is_the_owner(tmp_path: Path) -> None:
    """The peer's /state as the head receives it (validated): its ras check critical, RAS down."""
    from dgxdoctor.documents import ResultsDocument

    vllm_proc(tmp_path)
    with scripted(report("stall_rank11.txt")) as server:
        ras_a = run(tmp_path, server.port)

    def stopped(conn: socket.socket) -> None:
        time.sleep(4)

    with scripted([stopped]) as server:
        ras_b = run(tmp_path, server.port, deadline_s=1)
    a = ResultsDocument.of("dgx-a", [ras_a]).state()
    b = validate_state(ResultsDocument.of("dgx-b", [ras_b]).state())
    msg = next(f.message for f in compare([a, b]).findings if f.code == "PEER_TP_RANK_STUCK")
    assert msg.startswith("rank 11 on dgx-b, GPU 3, unresponsive since ")
    assert "node known as its own RAS stopped answering" in msg

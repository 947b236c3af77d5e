"""`dgxdoctor diagnose` on what people paste: one line, the end of a traceback, a cut status, several kinds at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.result import Status

FIX = Path(__file__).resolve().parents[1] / "fixtures"

# The lines of the issue report, each pasted alone.
TP_LINE = "ValueError: Total number of attention heads (52) must be divisible by tensor parallel size (8).\n"
# vllm-project/vllm#15598
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity of "
    "23.64 GiB of which 1.07 GiB is free.\n"
)
# NVIDIA/nccl#1814 (the issue title; the address masked there)
NCCL_WARN_LINE = (
    "NCCL WARN NET/IB : Got completion from peer xxx.xxx.xxx.xxx<55921> with status=12 opcode=1 len=0 vendor err "
    "129 (Send) localGid ::ffff:29.87.4.221 remoteGids::ffff:29.87.88.182\n"
)


@pytest.mark.parametrize(
    ("text", "code"),
    [(TP_LINE, "TP_HEADS_NOT_DIVISIBLE"), (OOM_LINE, "CUDA_OOM"), (NCCL_WARN_LINE, "NCCL_NETWORK_ERROR")],
)
def test_one_pasted_line_is_named(text: str, code: str) -> None:
    (d,) = diagnose(text)
    assert d.kind == "text"
    assert [f.code for f in d.findings] == [code]
    assert d.status is Status.CRITICAL


def test_cli_reads_a_line_from_stdin() -> None:
    run = run_cli("diagnose", "-", stdin=TP_LINE)
    assert run.returncode == 2, run.stderr
    assert "TP_HEADS_NOT_DIVISIBLE" in run.stdout and "UNRECOGNIZED" not in run.stdout


def test_last_lines_of_a_traceback() -> None:
    tail = (
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/config.py", line 255, in verify_with_parallel_config\n'
        "    raise ValueError(\n" + TP_LINE
    )
    assert [f.code for d in diagnose(tail) for f in d.findings] == ["TP_HEADS_NOT_DIVISIBLE"]


@pytest.mark.parametrize(
    "text",
    [
        "Resources\n" + "-" * 63 + "\nUsage:\n 0.0/16.0 CPU\n 0.0/8.0 GPU\n",
        "Total Usage:\n 0.0/2.0 CPU\n 0.0/8.0 GPU\n",
        "Usage:\n0.0/2.0 CPU\n0.0/8.0 GPU\n",  # indentation lost in the paste
    ],
)
def test_partial_ray_status_says_what_it_shows(text: str) -> None:
    (d,) = diagnose(text)
    assert d.kind == "ray-status"
    assert {f.code for f in d.findings} == {"RAY_GPUS_MISSING"}  # 8 of 16; the node count is not in the paste
    assert d.data["nodes_alive"] is None and d.data["gpus_total"] == 8.0


def test_partial_ray_status_without_usage_judges_no_gpus() -> None:
    text = "Pending Demands:\n {'CPU': 0.001, 'GPU': 8.0} * 2 (STRICT_SPREAD): 1+ pending placement groups\n"
    (d,) = diagnose(text)
    assert d.kind == "ray-status"
    assert [f.code for f in d.findings] == ["RAY_PLACEMENT_GROUP_PENDING"]
    assert d.data["gpus_total"] is None


def test_log_with_an_embedded_ray_status_reads_both() -> None:
    log = (FIX / "logs" / "ray_gpus_pending.log").read_text()
    status = (FIX / "ray" / "dead-ray-status.txt").read_text()
    found = diagnose(log + status + log)
    kinds = [d.kind for d in found]
    assert "ray-status" in kinds and kinds[-1] in ("vllm-log", "ray-log", "text")
    codes = {f.code for d in found for f in d.findings}
    assert {"RAY_GPUS_MISSING", "RAY_GPUS_PENDING"} <= codes


def test_a_kernel_log_with_a_vllm_failure_reads_both() -> None:
    text = (FIX / "kernel_log" / "open_gpu_1151_journal_xid79.txt").read_text() + OOM_LINE
    kinds = {d.kind: {f.code for f in d.findings} for d in diagnose(text)}
    assert kinds == {"kernel-log": {"XID_79"}, "text": {"CUDA_OOM"}}


def test_a_healthy_structured_paste_gets_no_text_reading() -> None:
    (d,) = diagnose((FIX / "ray" / "healthy-ray-status.txt").read_text())
    assert d.kind == "ray-status" and d.findings == ()


def test_plain_text_is_still_unrecognised() -> None:
    (d,) = diagnose("hello world\n")
    assert [f.code for f in d.findings] == ["UNRECOGNIZED_INPUT"]


def test_forced_kind_reads_one_kind() -> None:
    (d,) = diagnose(TP_LINE, kind="vllm-log")
    assert d.kind == "vllm-log" and [f.code for f in d.findings] == ["TP_HEADS_NOT_DIVISIBLE"]


def test_a_port_block_of_ibstat_without_its_ca_line() -> None:
    # tests/fixtures/ib/ibstat_cx6_hdr_down.txt's port, pasted alone
    (d,) = diagnose("Port 1:\n\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 10\n")
    assert d.kind == "ibstat"
    assert [(f.code, f.subject) for f in d.findings] == [("IB_PORT_DOWN", "unnamed/1")]


def test_rows_of_an_nccl_tests_table_without_its_header() -> None:
    rows = (FIX / "nccl_tests" / "h200_probe_allreduce.txt").read_text().splitlines()
    table = [r for r in rows if r.strip() and not r.lstrip().startswith("#")][-3:]
    (d,) = diagnose("\n".join(table) + "\n")
    assert d.kind == "nccl-tests" and d.summary is not None and "busbw peak" in d.summary


# PyTorch's ProcessGroupNCCL banner as ProcessGroupNCCL.cpp logs it at INFO: 2.0's option records, 2.4's
# environments with the torchrun rank prefix, 2.6's HeartbeatMonitor line in glog's own format.
PG_NCCL_BANNER = (
    "[I ProcessGroupNCCL.cpp:850] [Rank 0] NCCL watchdog thread started!\n"
    "[I ProcessGroupNCCL.cpp:672] [Rank 0] ProcessGroupNCCL initialized with following options:\n"
    "NCCL_ASYNC_ERROR_HANDLING: 1\n"
    "NCCL_BLOCKING_WAIT: 0\n"
    "TIMEOUT(ms): 1800000\n"
    "[rank3]:[I1205 08:00:01.123456789 ProcessGroupNCCL.cpp:914] [PG ID 1 PG GUID 1 Rank 3] ProcessGroupNCCL "
    "environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 1, TORCH_NCCL_DUMP_ON_TIMEOUT: 0\n"
    "I1205 08:00:01.123456 4030959 ProcessGroupNCCL.cpp:1669] [PG ID 0 PG GUID 0 Rank 3] HeartbeatMonitor "
    "environments: TORCH_NCCL_ENABLE_MONITORING (Whether to kill program when no watchdog heartbeat detected): 1\n"
)


@pytest.mark.parametrize("start", [0, 5, 6], ids=["whole", "2.4-form", "glog-form"])
def test_a_pytorch_process_group_nccl_banner_alone_is_a_healthy_nccl_log(start: int) -> None:
    """A recognised log with no failure: "ok", not UNRECOGNIZED_INPUT (PyTorch's NCCL process group's own log)."""
    text = "".join(PG_NCCL_BANNER.splitlines(keepends=True)[start:])
    (d,) = diagnose(text)
    assert d.kind == "nccl-log" and d.findings == () and d.status is Status.OK
    run = run_cli("diagnose", "-", stdin=text)
    assert run.returncode == 0, run.stderr
    assert "UNRECOGNIZED" not in run.stdout

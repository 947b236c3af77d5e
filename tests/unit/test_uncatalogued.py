"""What nobody catalogued still surfaces: a plain failure the catalog does not know is one UNCATALOGUED_ERROR warning
per distinct message in `diagnose`, never "ok" and never UNRECOGNIZED_INPUT; what is not a failure stays silent.
Excerpts: tests/fixtures/uncatalogued (SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.result import Finding, Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "uncatalogued"
EXCERPTS = sorted(FIXTURES.glob("*.txt"))


def _unknown(text: str) -> list[Finding]:
    return [f for d in diagnose(text) for f in d.findings if f.code == "UNCATALOGUED_ERROR"]


# The classes the catalog has since grown by construction (data/cuda_status_templates.json; safetensors' one
# exception type): these excerpts are now named by their class, and only what the catalog still does not know in
# them (SGLang's own RuntimeError) stays UNCATALOGUED_ERROR.
NOW_CATALOGUED = {
    "cublas_execution_failed_vllm": "CUDA_LIBRARY_ERROR",
    "cublas_strided_batched": "CUDA_LIBRARY_ERROR",
    "sglang_cublas_gemm": "CUDA_LIBRARY_ERROR",
    "device_side_assert": "CUDA_RUNTIME_ERROR",
    "nemo_device_side_assert": "CUDA_RUNTIME_ERROR",
    "safetensors_metadata_incomplete": "CHECKPOINT_LOAD_FAILED",
}


@pytest.mark.parametrize("path", EXCERPTS, ids=lambda p: p.stem)
def test_an_uncatalogued_failure_is_a_warning_quoting_its_line(path: Path) -> None:
    text = path.read_text()
    found = diagnose(text)
    assert all(f.code != "UNRECOGNIZED_INPUT" for d in found for f in d.findings)
    assert all(d.status is not Status.OK for d in found)
    if path.stem in NOW_CATALOGUED:
        named = [f for d in found for f in d.findings if f.code == NOW_CATALOGUED[path.stem]]
        assert named and all(f.status is Status.CRITICAL for f in named)
        # a line the catalog names is not quoted again as uncatalogued
        assert not {f.evidence for f in named} & {f.evidence for f in _unknown(text)}
        return
    unknown = _unknown(text)
    assert unknown and all(f.status is Status.WARNING and f.action == "none" for f in unknown)
    for finding in unknown:
        assert finding.evidence is not None and finding.evidence in text
        assert finding.evidence[:60] in finding.message


def test_one_finding_per_distinct_message_counted() -> None:
    text = "".join(
        f"(APIServer pid=7) ERROR 12-05 08:00:{n:02d} [serving_chat.py:210] Error in preprocessing prompt inputs of "
        f"request chatcmpl-{n}{n}\n"
        for n in range(5)
    )
    text += (
        "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!\n"
    )
    unknown = _unknown(text)
    assert [f.message.split(",")[1].split(":")[0].strip() for f in unknown] == ["5 line(s)", "1 line(s)"]
    assert unknown[0].subject == "line 1" and unknown[1].subject == "line 6"


@pytest.mark.parametrize(
    "line",
    [
        "<3>[ 1234.567890] ata1.00: failed command: READ FPDMA QUEUED",
        "3,1234,5678901234,-;ata1.00: failed command: READ FPDMA QUEUED",
        "[rank0]:[E1205 08:00:01.123456 4242 ProcessGroupNCCL.cpp:616] [Rank 0] some new failure",
        "2024-07-25 06:50:45,878\tERROR worker.py:1603 -- something nobody wrote a signature for",
        "[2026-11-30 02:06:41,232 E 22797 22797] core_worker.cc:100: an unknown core worker failure",
        "ERROR:root:an unknown failure",
    ],
)
def test_error_records_of_every_source_surface(line: str) -> None:
    (finding,) = _unknown(line + "\n")
    assert finding.evidence == line


BENIGN = [
    'INFO 12-05 08:00:01 [metrics.py:100] vllm:request_success_total{finished_reason="error"} 3',
    "(APIServer pid=7) WARNING 12-05 08:00:01 [utils.py:10] retrying after a transient error",
    "<6>[ 12.345678] mlx5_core 0000:01:00.0: firmware version: 28.39.1002",
    "12,1301,97612345678,-;a user-space write at warning level",
    '    raise ValueError(f"unsupported dtype {dtype}")',
    "CUBLAS_STATUS_SUCCESS",
]


def test_benign_lines_and_a_help_text_stay_silent() -> None:
    assert _unknown("\n".join(BENIGN) + "\n") == []
    for args in (("--help",), ("diagnose", "--help"), ("check", "--help")):
        text = run_cli(*args).stdout
        assert "Usage" in text
        assert _unknown(text) == [], args


def test_a_known_failure_and_its_traceback_are_the_catalogs() -> None:
    """The catalog's line (and the rest of its traceback) is not also an unknown one."""
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/x.py", line 3, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.00 GiB is free.\n"
    )
    found = [f for d in diagnose(text) for f in d.findings]
    assert found and all(f.code != "UNCATALOGUED_ERROR" for f in found)


CORPUS = FIXTURES.parent / "corpus" / "healthy"
KERNEL_LOG = FIXTURES.parent / "kernel_log"
# The healthy kernel logs: look-alikes of faults and a healthy boot's /dev/kmsg records (benchmarks/real_logs.py's
# kernel kind is read from these three).
HEALTHY_KERNEL = ("lookalikes.txt", "faults_lookalikes.txt", "kmsg_records_h200_580.txt")
HEALTHY = [*sorted(CORPUS.glob("*.txt")), *(KERNEL_LOG / name for name in HEALTHY_KERNEL)]


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.stem)
def test_the_healthy_corpus_gives_no_uncatalogued_error_and_no_warning(path: Path) -> None:
    found = [f for d in diagnose(path.read_text()) for f in d.findings]
    assert [f for f in found if f.code == "UNCATALOGUED_ERROR" or f.status in (Status.WARNING, Status.CRITICAL)] == []


def test_a_benign_kernel_line_is_named_with_its_reason_and_a_failure_beside_it_still_surfaces() -> None:
    from dgxdoctor.judge.benign import KNOWN_BENIGN, known_benign
    from dgxdoctor.judge.uncatalogued import uncatalogued

    banner = (
        "3,355,437110,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)"
    )
    old = "<3>[    3.45] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
    for line in (banner, old):
        entry = known_benign(line)
        assert entry is not None and entry.reason and entry.seen
    assert all(entry.reason and entry.seen for entry in KNOWN_BENIGN)
    # The daemon's logs check and diagnose share the pass: the banner is silent there too.
    assert uncatalogued([banner, old], set()) == []
    failure = "3,356,437111,-;nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff"
    found = uncatalogued([banner, failure], set())
    assert [u.line for u in found] == [failure]
    (one,) = _unknown(banner + "\n" + failure + "\n")
    assert one.status is Status.WARNING and "nvme0" in one.message
    assert known_benign("3,357,437112,-;NVRM: loading failed: RmInitAdapter") is None


# Real lines of a healthy server (benchmarks/healthy_days.py over benchmarks/serve_for_hours.py's run, vLLM 0.32 CPU)
# and of a vLLM 0.10 report: the server answering a request for a model it does not serve (404).
UNKNOWN_MODEL = [
    "(APIServer pid=15597) ERROR 12-05 15:10:47 [serving.py:274] Error with model error=ErrorInfo(message='The model "
    "`tiny-v2` does not exist. Valid aliases: tiny.', type='NotFoundError', param='model', code=404)",
    "ERROR 08-13 16:59:20 [serving_chat.py:140] Error with model object='error' message='The model "
    "`meta-llama/Meta-Llama-3-8B-Instruct` does not exist.' type='NotFoundError' param=None code=404",
]


def test_a_request_for_a_model_not_served_is_the_clients_and_a_server_error_still_surfaces() -> None:
    from dgxdoctor.judge.benign import known_benign
    from dgxdoctor.judge.uncatalogued import uncatalogued

    access = 'INFO:     127.0.0.1:46338 - "POST /v1/chat/completions HTTP/1.1" 404 Not Found'
    for line in UNKNOWN_MODEL:
        entry = known_benign(line)
        assert entry is not None and entry.name == "vllm_unknown_model"
        assert _unknown(line + "\n" + access + "\n") == []
        assert uncatalogued([line, access], set()) == []  # the daemon's logs check counts none either
    # The same words with a server error, and another ERROR record of the server: still failures nobody catalogued.
    server = UNKNOWN_MODEL[0].replace("type='NotFoundError'", "type='InternalServerError'").replace("404", "500")
    other = "(APIServer pid=7) ERROR 12-05 08:00:01 [serving_chat.py:210] Error in preprocessing prompt inputs"
    assert known_benign(server) is None
    found = _unknown("\n".join([UNKNOWN_MODEL[0], server, other]) + "\n")
    assert [f.evidence for f in found] == [server, other]
    assert all(f.status is Status.WARNING for f in found)

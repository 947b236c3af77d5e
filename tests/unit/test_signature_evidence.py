"""Evidence beyond one catalog line: traceback frames when the exception line is missing, and a benign NCCL line
beside the real cause (tests/fixtures/corpus/frames/ and cause/, sources in the corpus's SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.judge.frames import FrameRule, frame_findings, frames_of, load_rules
from dgxdoctor.judge.signatures import CatalogError, load_catalog
from dgxdoctor.result import Finding, Status

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
FRAMES = sorted((CORPUS / "frames").glob("*.txt"))


def _findings(text: str) -> dict[str, Finding]:
    return {f.code: f for d in diagnose(text) for f in d.findings}


@pytest.mark.parametrize("path", FRAMES, ids=lambda p: p.stem)
def test_a_cut_traceback_is_named_likely_from_its_frames(path: Path) -> None:
    found = _findings(path.read_text(encoding="utf-8"))
    finding = found[path.stem.upper()]
    assert finding.status is Status.WARNING
    assert finding.message.startswith("likely ")
    assert "File " in (finding.evidence or "")
    assert finding.remedy


def test_the_exception_line_when_present_wins_over_the_frames() -> None:
    cut = (CORPUS / "frames" / "tp_heads_not_divisible.txt").read_text(encoding="utf-8")
    whole = cut + "[rank4]: AssertionError: 2 is not divisible by 4\n"
    finding = _findings(whole)["TP_HEADS_NOT_DIVISIBLE"]
    assert finding.status is Status.CRITICAL
    assert not finding.message.startswith("likely")


def test_frames_beside_a_named_cause_after_them_add_nothing() -> None:
    cut = (CORPUS / "frames" / "torch_rendezvous_timeout.txt").read_text(encoding="utf-8")
    text = cut + "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)\n"
    assert set(_findings(text)) == {"CUDA_UNHANDLED_ERROR"}


def test_raise_if_cache_size_invalid_frame_reads_as_kv_cache() -> None:
    # vLLM 0.6's call site, as Python prints it: vllm-project/vllm@v0.6.3.post1:vllm/worker/worker.py:262
    where = '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", '
    line = where + "line 262, in initialize_cache\n"
    frame = where + "line 488, in raise_if_cache_size_invalid\n"
    finding = _findings(line + "    raise_if_cache_size_invalid(num_gpu_blocks,\n" + frame)["KV_CACHE_NO_MEMORY"]
    assert finding.status is Status.WARNING and finding.message.startswith("likely ")


def test_faulthandler_frames_without_a_comma_are_frames() -> None:
    text = (CORPUS / "frames" / "nccl_system_error.txt").read_text(encoding="utf-8")
    funcs = [func for _, _, func in frames_of(text.splitlines())]
    assert funcs[0] == "__init__" and "initialize_model_parallel" in funcs


def test_a_rule_takes_its_steps_in_either_traceback_order() -> None:
    rule = FrameRule("NCCL_SYSTEM_ERROR", (("", "initialize_model_parallel"), ("pynccl.py", "__init__")))
    state = "vllm/distributed/parallel_state.py"
    outer_first = [(0, state, "initialize_model_parallel"), (1, "x/pynccl.py", "__init__")]
    inner_first = [(0, "x/pynccl.py", "__init__"), (1, state, "initialize_model_parallel")]
    assert rule.first_step_at(outer_first) == (0, 1)
    assert rule.first_step_at(inner_first) == (0, 1)
    assert rule.first_step_at(inner_first[:1]) is None


def test_every_frame_rule_names_a_catalog_signature() -> None:
    codes = load_catalog().by_code()
    assert {rule.code for rule in load_rules()} <= set(codes)
    from dgxdoctor.judge.frames import parse_rules

    with pytest.raises(CatalogError, match="frame\\[0\\]: code must name a signature"):
        parse_rules({"frame": [{"code": "NOPE", "steps": ["f"]}]}, codes)
    with pytest.raises(CatalogError, match="steps must be"):
        parse_rules({"frame": [{"code": "GPU_LOST", "steps": []}]}, codes)


def test_no_frames_no_findings() -> None:
    lines = ["INFO 07-25 06:50:45 config.py:718] Defaulting to use ray for distributed inference"]
    assert frame_findings(lines, (), load_catalog().by_code()) == []


def test_netib_no_device_beside_a_cuda_failure_names_the_cuda_failure() -> None:
    text = (CORPUS / "cause" / "netib_beside_cuda_failure_wsl2.txt").read_text(encoding="utf-8")
    found = _findings(text)
    assert "NCCL_NET_FAILURE" not in found
    assert {"CUDA_UNHANDLED_ERROR", "CUDA_DRIVER_INIT"} <= set(found)


def test_netib_no_device_alone_is_still_the_network() -> None:
    text = "ip-172-31-0-11:45384:45384 [0] NCCL INFO NET/IB : No device found.\nNCCL version 2.4.7+cuda9.2\n"
    assert set(_findings(text)) == {"NCCL_NET_FAILURE"}


def test_a_verbs_failure_beside_a_cuda_failure_is_both() -> None:
    text = (
        "aigc-maas-instance-leader-0:1639:1915 [0] misc/ibvwrap.cc:206 NCCL WARN Call to ibv_modify_qp failed with"
        " error No such device errno 19\n"
        "00127-desktop:212030:212030 [0] transport.cc:154 NCCL WARN Cuda failure 'invalid argument'\n"
    )
    assert {"NCCL_NET_FAILURE", "CUDA_UNHANDLED_ERROR"} <= set(_findings(text))


def test_the_new_classes_feed_remediation_as_their_cause_asks() -> None:
    from dgxdoctor.judge.consequence import of_code

    assert of_code("RAY_GCS_UNREACHABLE", Status.CRITICAL).action == "restart_cluster"
    # No restart cures drift, a lost or faulty GPU, a host without RAM, a container's /dev/shm: a person is paged.
    for code in ("RAY_VERSION_MISMATCH", "GPU_LOST", "CUDA_ECC_ERROR", "RAY_HOST_OOM", "SHM_TOO_SMALL"):
        assert of_code(code, Status.CRITICAL).action == "page", code
    # A host OOM kill of a Ray worker is not a CUDA OOM: the catalog names it RAY_HOST_OOM, never CUDA_OOM.
    text = "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
    assert set(_findings(text)) == {"RAY_HOST_OOM"}


def test_a_kernel_log_of_xid_79_is_the_kernel_readers_not_gpu_lost_twice() -> None:
    text = (CORPUS.parent / "kernel_log" / "journal_610_xid79_xid154_os_reboot.txt").read_text(encoding="utf-8")
    kinds = {d.kind: {f.code for f in d.findings} for d in diagnose(text)}
    assert "XID_79" in kinds["kernel-log"] and "GPU_LOST" not in kinds.get("text", set())

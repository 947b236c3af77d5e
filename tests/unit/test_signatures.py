"""Every catalog signature is found in its real log excerpt; real look-alike lines match nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dgxdoctor.judge.scan import scan_text
from dgxdoctor.judge.signatures import CatalogError, load_catalog, parse_catalog
from dgxdoctor.result import Status

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus" / "failures"
# Codes with a one-file excerpt in tests/fixtures/logs/ (the corpus in tests/fixtures/corpus/ covers every class).
REQUIRED = [
    "NCCL_NET_FAILURE",
    "NCCL_NETWORK_ERROR",
    "NCCL_TIMEOUT",
    "NCCL_SYSTEM_ERROR",
    "GLOO_SOCKET",
    "MODEL_PATH_MISSING",
    "TP_HEADS_NOT_DIVISIBLE",
    "KV_CACHE_NO_MEMORY",
    "RAY_GPUS_PENDING",
    "RAY_WORKER_DIED",
    "CUDA_OOM",
]


CORPUS_ONLY = [
    "CUDA_UNHANDLED_ERROR",
    "CUDA_ILLEGAL_ACCESS",
    "MAX_MODEL_LEN_TOO_LARGE",
    "RAY_NODE_LOST",
    "RAY_CHANNEL_TIMEOUT",
    "VLLM_ENGINE_DEAD",
    "CUDA_OOM_STARTUP",
    "CUDA_OOM_SERVING",
    "RAY_VERSION_MISMATCH",
    "SHM_TOO_SMALL",
    "TORCH_RENDEZVOUS_TIMEOUT",
    "NCCL_DUPLICATE_GPU",
    "CUDA_DRIVER_INIT",
    "RAY_GCS_UNREACHABLE",
    "RAY_HOST_OOM",
    "CUDA_P2P_UNSUPPORTED",
    "CUDA_ECC_ERROR",
    "NO_GPU_VISIBLE",
    "GPU_LOST",
    # Issue 35's classes built by construction (data/cuda_status_templates.json; safetensors' one exception type).
    "CUDA_RUNTIME_ERROR",
    "CUDA_LIBRARY_ERROR",
    "CHECKPOINT_LOAD_FAILED",
]


def test_catalog_has_every_required_code_with_fix() -> None:
    catalog = load_catalog()
    codes = catalog.by_code()
    assert sorted(codes) == sorted(REQUIRED + CORPUS_ONLY)
    for sig in codes.values():
        assert sig.fix and sig.meaning and (sig.patterns or sig.refines)
        assert sig.severity in (Status.WARNING, Status.CRITICAL)


@pytest.mark.parametrize("code", REQUIRED)
def test_signature_found_in_its_real_excerpt(code: str) -> None:
    text = (LOGS / f"{code.lower()}.log").read_text()
    found = {m.code for m in scan_text(load_catalog(), text)}
    assert found == {code}


def test_real_vllm_capture_missing_model() -> None:
    text = (LOGS / "captured" / "vllm_0.32.0_missing_model.txt").read_text()
    matches = scan_text(load_catalog(), text, "vllm")
    assert {m.code for m in matches} == {"MODEL_PATH_MISSING"}
    assert "/models/glm-missing" in matches[0].line


def test_real_ray_capture_actor_died() -> None:
    catalog = load_catalog()
    driver = scan_text(catalog, (LOGS / "captured" / "ray_2.60.0_actor_died_driver.txt").read_text(), "ray")
    assert [m.code for m in driver] == ["RAY_WORKER_DIED", "RAY_WORKER_DIED"]
    session = (LOGS / "captured" / "ray_2.60.0_actor_died_session.txt").read_text().splitlines()
    assert [bool(catalog.match(line, "ray")) for line in session] == [True, True, False, False]


def test_every_pattern_is_exercised_by_a_fixture() -> None:
    catalog = load_catalog()
    files = [*LOGS.glob("*.log"), *LOGS.glob("captured/*.txt"), *CORPUS.glob("*.txt")]
    text = "\n".join(p.read_text() for p in files)
    # A wording no paste shows yet (a release newer than the threads) is exercised by its template from that
    # release's source (data/signature_templates.json, placeholders filled).
    table = json.loads(
        (Path(__file__).resolve().parents[2] / "src/dgxdoctor/data/signature_templates.json").read_text()
    )
    text += "\n" + "\n".join(
        re.sub(r"\{\}", "8", entry["template"]) for entries in table["signatures"].values() for entry in entries
    )
    # The CUDA runtime's errors and the CUDA libraries' statuses, as PyTorch prints them (data/cuda_status_templates
    # .json, from NVIDIA's wheels: tests/unit/test_cuda_status_catalog.py prints every one).
    status = json.loads(
        (Path(__file__).resolve().parents[2] / "src/dgxdoctor/data/cuda_status_templates.json").read_text()
    )
    for entry in status["cuda_runtime"]:
        text += f"\ncuda runtime error ({entry['value']}) : {entry['message']}\nSearch for `{entry['name']}' in https://docs.nvidia.com/cuda"
    text += "\n" + "\n".join(
        f"CUDA error: {e['name']} when calling" for lib in ("cublas", "cusparse", "cudnn") for e in status[lib]
    )
    for sig in catalog.signatures:
        for pattern in sig.patterns:
            assert pattern.search(text), f"{sig.code}: {pattern.pattern!r} has no real example in fixtures"


@pytest.mark.parametrize("line", (LOGS / "lookalikes.log").read_text().splitlines())
def test_lookalike_line_matches_nothing(line: str) -> None:
    assert load_catalog().match(line) == []


def test_tutorial_strings() -> None:
    catalog = load_catalog()
    assert [m.code for m in catalog.match("OSError: /models/glm does not exist")] == ["MODEL_PATH_MISSING"]
    assert [m.code for m in catalog.match("NCCL WARN NET/IB : No device found")] == ["NCCL_NET_FAILURE"]
    heads = "ValueError: Total number of attention heads must be divisible by tensor parallel size"
    assert [m.code for m in catalog.match(heads)] == ["TP_HEADS_NOT_DIVISIBLE"]


def test_kind_filter() -> None:
    catalog = load_catalog()
    line = "RuntimeError: CUDA error: out of memory"
    assert catalog.match(line, "vllm") and catalog.match(line, "ray")
    assert catalog.match(line, "dmesg") == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no [[signature]]"),
        ({"signature": [{"code": "bad code"}]}, "UPPER_SNAKE"),
        (
            {"signature": [{"code": "X", "severity": "fatal", "kinds": ["vllm"], "meaning": "m", "fix": "f"}]},
            "severity",
        ),
        (
            {
                "signature": [
                    {
                        "code": "X",
                        "severity": "warning",
                        "kinds": ["vllm"],
                        "meaning": "m",
                        "fix": "f",
                        "patterns": ["("],
                    }
                ]
            },
            "does not compile",
        ),
        (
            {
                "signature": [
                    {
                        "code": "X",
                        "severity": "warning",
                        "kinds": ["vllm"],
                        "meaning": "m",
                        "fix": "f",
                        "patterns": ["(?P<x>a)"],
                    }
                ]
            },
            "named groups",
        ),
    ],
)
def test_bad_catalog_is_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(CatalogError, match=message.replace("[", r"\[")):
        parse_catalog(data)


def test_a_refining_signature_replaces_its_base_on_the_same_line() -> None:
    line = "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests."
    assert [m.code for m in load_catalog().match(line)] == ["CUDA_OOM_STARTUP"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"refines": "not a code"}, "refines must name"),
        ({"refines": "NOPE"}, "refines unknown signature"),
        ({"patterns": ["(?s)xxxx"]}, "leading (?i)"),
        ({"patterns": ["a.b\\d+"]}, "4+ literal characters"),
        # The prefilters look for one anchor per pattern: a line matching only the other branch would be dropped.
        ({"patterns": ["NCCL WARN foo|Gloo connectFullMesh failed"]}, "top-level |"),
    ],
)
def test_catalog_rejects_bad_refines_and_flags(entry: dict[str, object], message: str) -> None:
    base = {"code": "X", "severity": "warning", "kinds": ["vllm"], "meaning": "m", "fix": "f", "patterns": ["xxxx"]}
    with pytest.raises(CatalogError, match=re.escape(message)):
        parse_catalog({"signature": [{**base, **entry}]})


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("NCCL (?:INFO|WARN) NET/IB ?: ?No device found", "No device found"),
        ("OSError: \\S+ does not exist", "does not exist"),  # a short run loses to a longer one
        ("NCCL WARN .*[Nn]o device found", "o device found"),  # never a line marker (issue 34)
        ("CUDA (?:driver )?error: out of memory", "error: out of memory"),
        ("max seq len \\(\\d+\\) is larger than", ") is larger than"),
        ("(?i)cuda out of memory", "cuda out of memory"),
        ("ncclRemoteError", "RemoteError"),
    ],
)
def test_anchor_is_literal_text_every_match_contains(pattern: str, expected: str) -> None:
    from dgxdoctor.judge.signatures import anchor

    assert anchor(pattern) == expected


def test_every_anchor_is_in_every_line_its_pattern_matches() -> None:
    from dgxdoctor.judge.signatures import _anchor_forms

    files = [*LOGS.glob("*.log"), *LOGS.glob("captured/*.txt"), *CORPUS.glob("*.txt")]
    lines = [line for p in files for line in p.read_text().splitlines()]
    for sig in load_catalog().signatures:
        for pattern in sig.patterns:
            forms = _anchor_forms(pattern.pattern)
            for line in lines:
                if pattern.search(line):
                    assert any(f in line for f in forms), (sig.code, pattern.pattern, line)

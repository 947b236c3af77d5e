"""How people paste: every artefact of tests/fixtures/paste/ (real pasted lines, SOURCES.md there) is read through
the one normaliser (judge.records.clean) before matching, the evidence keeps the line as pasted, and the record
shape is read after the normaliser: a request-log line behind any of these prefixes is still a request line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.judge.records import Trust, clean, shape
from dgxdoctor.judge.signatures import load_catalog

PASTE = Path(__file__).resolve().parents[1] / "fixtures" / "paste"
HEADER = re.compile(r"^=== (?P<source>\S+) \| (?P<code>[A-Z_]+) \| (?P<what>.+?)\r?$", re.M)


def excerpts() -> list[tuple[str, str, str, str]]:
    out = []
    for path in sorted(PASTE.glob("*.txt")):
        text = path.read_bytes().decode("utf-8")
        heads = list(HEADER.finditer(text))
        assert heads and heads[0].start() == 0, path.name
        for head, nxt in zip(heads, [*heads[1:], None], strict=True):
            body = text[head.end() + 1 : nxt.start() if nxt else len(text)]
            out.append((path.stem, head["source"], head["code"], body))
    return out


def codes_named(text: str) -> set[str]:
    return {f.code for d in diagnose(text) for f in d.findings}


def with_refinements(code: str) -> set[str]:
    return {code} | {s.code for s in load_catalog().signatures if s.refines == code}


@pytest.mark.parametrize(("artefact", "source", "code", "text"), excerpts(), ids=lambda v: str(v)[:40])
def test_every_pasted_excerpt_is_named(artefact: str, source: str, code: str, text: str) -> None:
    found = codes_named(text)
    assert with_refinements(code) & found, f"{artefact} ({source}): found {sorted(found)} in {text!r}"


def test_every_artefact_has_a_fixture_and_a_source() -> None:
    listed = (PASTE / "SOURCES.md").read_text(encoding="utf-8")
    for artefact, source, _, _ in excerpts():
        assert f"{artefact}.txt" in listed and source in listed, (artefact, source)
    assert len({e[0] for e in excerpts()}) >= 10


def test_evidence_keeps_the_line_as_pasted() -> None:
    text = (PASTE / "docker_compose.txt").read_text(encoding="utf-8")
    evidence = [f.evidence or "" for d in diagnose(text) for f in d.findings if f.code == "NCCL_SYSTEM_ERROR"]
    assert evidence and evidence[0].startswith("vllm-1  | ERROR 11-18")


REQUEST = (
    "INFO 06-13 07:35:57 [logger.py:43] Received request chatcmpl-1d0f: prompt: 'NCCL WARN NET/IB : No device "
    "found ncclSystemError', params: SamplingParams(n=1), prompt_token_ids: None, lora_request: None."
)
ACCESS = 'INFO:     127.0.0.1:5000 - "GET /ncclSystemError HTTP/1.1" 404 Not Found'
PREFIXES = [
    "vllm-1  | ",
    "Aug 19 18:34:30 vllm vllm[8707]: ",
    "Aug 19 18:34:30 vllm vllm[8707]: (APIServer pid=8707) ",
    "[pod/vllm-0/vllm] ",
    "2024-10-23T19:30:56.633885910Z ",
    "[2025-12-13T19:54:35Z] ",
    "  | ",
    "(EngineCore_DP0 pid=1) (RayWorkerWrapper pid=2, ip=10.0.0.2) ",
    "\ufffd[36m(APIServer pid=7)\ufffd[0m ",
    "\x1b[32m",
    "[vllm]: ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("line", [REQUEST, ACCESS])
def test_a_request_line_behind_any_prefix_is_still_a_request_line(prefix: str, line: str) -> None:
    pasted = prefix + line
    assert shape(clean(pasted)).trust is Trust.DENIED, clean(pasted)
    assert load_catalog().match(pasted) == []
    assert not codes_named(pasted + "\r\n" + pasted + "\n") & {s.code for s in load_catalog().signatures}


def test_a_request_line_that_lost_its_first_letters_is_still_a_request_line() -> None:
    assert shape(clean(REQUEST[2:])).trust is Trust.DENIED
    assert shape(clean("RROR 12-18 10:00:00 [core.py:123] x")).trust is Trust.TRUSTED


@pytest.mark.parametrize(
    ("pasted", "record"),
    [
        ("vllm-1  | ERROR 11-18 10:02:11 engine.py:366] x", "ERROR 11-18 10:02:11 engine.py:366] x"),
        ("2024-10-23T19:30:56.633885910Z h:1:2 [0] NCCL WARN x", "h:1:2 [0] NCCL WARN x"),
        ("[36m(RayWorkerWrapper pid=1, ip=10.0.0.2)[0m ERROR 06-25 x", "ERROR 06-25 x"),
        ("Aug 19 18:34:30 vllm vllm[8707]: (APIServer pid=8707) INFO x\r", "INFO x"),
        (
            "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] x",
            "[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] x",
        ),
        ("timeout [5m] reached", "timeout [5m] reached"),
    ],
)
def test_clean_takes_off_only_what_pasting_added(pasted: str, record: str) -> None:
    assert clean(pasted) == record

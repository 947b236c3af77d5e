"""Text a client controls never raises a signature: every catalog example line, sent as a prompt, a request id, a
model output or a URL path, is named nowhere (the catalog, `diagnose`, the logs check that acts).

The attack lines are built from the catalog's own example lines (the comment above each pattern in
data/signatures.toml), in the request-logger formats of vLLM 0.4 to 0.32 (vllm/entrypoints/logger.py,
vllm/entrypoints/serve/utils/request_logger.py, v1/engine/async_llm.py) and uvicorn's and Ray dashboard's
access-log formats, bare and behind the prefixes a container runtime or journald adds.
"""

from __future__ import annotations

import re
import urllib.parse
from functools import cache
from importlib import resources
from pathlib import Path

import pytest

from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.environment import Environment
from dgxdoctor.judge.signatures import load_catalog

# "  # gpu5:35917:35994 [0] transport/net_ib.cu:788 NCCL WARN NET/IB : Got completion ..." above a pattern;
# "  #   (https://...)" lines name the source and are not examples.
EXAMPLE = re.compile(r"^\s+# (?! )(?P<line>.+?)(?:\s{2,}\(.*\))?$")
HEALTHY = "INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds"


@cache
def examples() -> dict[str, list[str]]:
    """Each signature's example lines from the catalog file, those that the catalog names as that signature."""
    text = resources.files("dgxdoctor").joinpath("data/signatures.toml").read_text(encoding="utf-8")
    catalog = load_catalog()
    by_code: dict[str, list[str]] = {}
    for line in _example_lines(text):
        for match in catalog.match(line):
            by_code.setdefault(match.code, []).append(line)
    return by_code


def _example_lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        m = EXAMPLE.match(raw)
        if m is not None:
            out.append(m["line"].strip())
    return out


def attacks(example: str) -> list[str]:
    """The example as text a client sent, in every record that prints such text."""
    rid = "chatcmpl-" + example
    path = urllib.parse.quote("/" + example)
    bare_path = "/" + re.sub(r"\s+", "", example)[:200]
    params = f"SamplingParams(n=1, temperature=0.7, stop=[{example!r}], max_tokens=16)"
    lines = [
        # vLLM 0.6-0.10, entrypoints/logger.py
        f"INFO 12-18 10:00:00 [logger.py:39] Received request chatcmpl-9f: prompt: {example!r}, params: {params}, "
        "prompt_token_ids: [1, 2, 3], prompt_embeds shape: None, lora_request: None.",
        # vLLM 0.4-0.5, async_llm_engine.py
        f"INFO 05-09 10:00:00 async_llm_engine.py:529] Received request cmpl-1: prompt: {example!r}, "
        f"sampling_params: {params}, prompt_token_ids: [1], lora_request: None.",
        # vLLM 0.32, serve/utils/request_logger.py (INFO and DEBUG), v1/engine/async_llm.py
        f"(APIServer pid=7) INFO 12-18 10:00:00 [request_logger.py:66] Received request {rid}: params: {params}, "
        "lora_request: None.",
        f"(APIServer pid=7) DEBUG 12-18 10:00:00 [request_logger.py:55] Request {rid} details: prompt: {example!r}, "
        "prompt_token_ids: None, prompt_embeds shape: None.",
        f"(APIServer pid=7) INFO 12-18 10:00:00 [request_logger.py:109] Generated response {rid}: output: "
        f"{example!r}, finish_reason: stop",
        f"(APIServer pid=7) INFO 12-18 10:00:00 [v1/engine/async_llm.py:578] Added request {rid}.",
        f"(APIServer pid=7) INFO 12-18 10:00:00 [v1/engine/async_llm.py:922] Aborted request(s) {rid}.",
        # uvicorn's access log (the path as uvicorn quotes it, and one without spaces as sent)
        f'INFO:     127.0.0.1:5000 - "GET {path} HTTP/1.1" 404 Not Found',
        f'(APIServer pid=7) INFO:     10.0.0.9:41234 - "POST {bare_path} HTTP/1.1" 404 Not Found',
        # Ray dashboard (aiohttp access log in dashboard.log)
        f'2025-03-10 15:07:20,123\tINFO web_log.py:206 -- 10.0.0.9 [10/Mar/2025:15:07:20 +0000] "GET {bare_path} '
        'HTTP/1.1" 404 173 "-" "curl/8.0"',
    ]
    # The same records as a container runtime, journald or a CI log shows them.
    prefixes = ["vllm-1  | ", "2025-03-10T15:07:20.123456789Z ", "Dec 18 10:00:00 dgx-a vllm[1234]: ", "\x1b[32m"]
    return lines + [p + line for p in prefixes for line in lines[:1] + lines[7:8]]


def all_codes() -> list[str]:
    return sorted(s.code for s in load_catalog().signatures)


def test_every_signature_has_an_example_line_the_catalog_names() -> None:
    found = examples()
    refined_only = {s.code for s in load_catalog().signatures if not s.patterns}
    assert set(all_codes()) - refined_only <= set(found), sorted(set(all_codes()) - set(found) - refined_only)


@pytest.mark.parametrize("code", all_codes())
def test_client_text_raises_no_signature(code: str, tmp_path: Path) -> None:
    catalog = load_catalog()
    lines = [line for example in examples().get(code, []) for line in attacks(example)]
    sig = catalog.by_code()[code]
    if not lines:
        assert sig.refines and not sig.patterns
        return
    for line in lines:
        assert catalog.match(line) == [], line
    text = "\n".join([HEALTHY, *lines, HEALTHY]) + "\n"
    codes = {f.code for d in diagnose(text) for f in d.findings}
    assert not codes & set(all_codes()), (codes, text)

    log = tmp_path / "vllm.log"
    log.write_text("")
    check = LogsCheck(
        LogsSettings(vllm_paths=[str(log)], ray_paths=[]), Environment(state_dir=tmp_path / "state", clock=lambda: 1.0)
    )
    check.run()
    log.write_text(text)
    result = check.run()
    assert result.findings == (), [(f.code, f.evidence) for f in result.findings]


@pytest.mark.parametrize("code", all_codes())
def test_the_same_example_printed_by_its_own_record_is_named(code: str, tmp_path: Path) -> None:
    """The control: the example line itself, as the process printed it, is named by diagnose and the check."""
    found = examples().get(code, [])
    if not found:
        return
    text = "\n".join([HEALTHY, found[0], HEALTHY]) + "\n"
    wanted = {code} | _refined_base(code)
    assert wanted & {f.code for d in diagnose(text) for f in d.findings}
    log = tmp_path / "vllm.log"
    log.write_text("")
    check = LogsCheck(
        LogsSettings(vllm_paths=[str(log)], ray_paths=[]), Environment(state_dir=tmp_path / "state", clock=lambda: 1.0)
    )
    check.run()
    log.write_text(text)
    assert wanted & {f.code for f in check.run().findings}


def _refined_base(code: str) -> set[str]:
    """A CUDA_OOM example reads as its phase when the lines around it say one."""
    return {s.code for s in load_catalog().signatures if s.refines == code}

"""What a log line is before any signature is searched in it: the paste normaliser and the record-shape rules.

``clean(line)`` is the one normaliser: it takes off what pasting adds around a record (carriage returns, real and
literal ANSI colour codes, container and CI timestamps, docker compose, journald and kubectl prefixes, Ray's nested
process prefixes, a mail quote) and mends a level whose first letters were lost (``RROR 12-18 ...``). Evidence
always keeps the original line; only matching reads the cleaned one.

``shape(text)`` then says who printed each line (``judge.scan`` adds the record that owns a line opening
none), so that text a client controls never raises a signature:

- ``DENIED``: a request record (vLLM's request logger: ``Received request ...: prompt: '...'``, ``Generated
  response``, ``Added``/``Aborted request``) or an HTTP access-log line (uvicorn's ``INFO: 127.0.0.1:5000 - "GET
  /ncclSystemError HTTP/1.1" 404``, Ray dashboard's aiohttp lines). No signature ever comes from it.
- ``CLIENT``: a vLLM record from the OpenAI-compatible server's request handling (``serving*.py``,
  ``api_server.py``, the chat template and tool parsers), and the traceback lines that follow it: these quote what
  a request sent, so a match there counts only outside quoted text, and only for ``diagnose``, never for the
  check that acts.
- ``TRUSTED``: NCCL's own ``host:pid:tid [dev] NCCL WARN`` records, PyTorch's c10d records, vLLM's engine and
  worker records, Ray's records (``(raylet)``, ``[... W pid tid] (gcs_server)``, ``... INFO x.py:1 -- ``), a
  traceback's frames and exception line outside a client record, and whatever text a process printed on its own.

The rules cannot see a client's text that a logging call wrote raw across several lines; vLLM's request logger
writes prompts with ``%r`` (one line, quotes escaped), which is what makes the request record recognisable.
"""

from __future__ import annotations

import re
from enum import Enum

from msgspec import Struct

MAX_PREFIXES = 8


class Trust(Enum):
    TRUSTED = "trusted"
    CLIENT = "client"
    DENIED = "denied"


# Real and literal colour codes: "\x1b[36m(RayWorkerWrapper pid=1)\x1b[0m"; pasted with the escape character lost
# or replaced: "\ufffd[36m(RayWorkerWrapper pid=4183, ip=10.3.32.122)\ufffd[0m ERROR 06-03 23:13:39 worker_base.py:148]"
# (tests/fixtures/paste/SOURCES.md), or shown as "^[[0;36m".
ANSI = re.compile(
    r"(?:\^\[|\\x1b\[|\\033\[|\\e\[|\u241b\[|\ufffd\[|\x1b\[|\[)(?:\d{1,3}(?:;\d{1,3})*)?m(?!\])|\x1b\[[0-9;?]*[A-Za-z]"
)
# What every match of ANSI's first branch contains ("[" digits "m"); the second needs the escape character itself.
# Searched first: most log lines hold a "[" ("[loader.py:447]") and ANSI is several times slower to run.
ANSI_HINT = re.compile(r"\[[\d;]*m")
# Prefixes that pasting, a container runtime or a log collector put before the record, one regex each:
PREFIXES = (
    # 2025-03-10T15:07:20.123456789Z INFO 03-10 ...      (docker logs -t, kubectl logs --timestamps: RFC 3339)
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"),
    # [2025-03-10T15:07:20Z] ERROR 03-10 ...             (CI runners and schedulers that stamp each line)
    re.compile(r"\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]\s*"),
    # Dec 18 10:00:00 dgx-a vllm[1234]: ERROR 12-18 ...   (journalctl -u vllm; -o short-iso starts 2025-12-18T10:..)
    re.compile(r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+) \S+ [\w.@/-]+(?:\[\d+\])?: "),
    # [pod/vllm-0/vllm] INFO 03-10 ...                    (kubectl logs --prefix)
    re.compile(r"\[pod/[^\]\s]+\]\s"),
    # vllm-1  | INFO 03-10 ...  /  vllm_server | ...      (docker compose; "  | " from CI log viewers)
    re.compile(r"(?:[\w.-]+)?\s*\| "),
    # (EngineCore_DP0 pid=34) (RayWorkerWrapper pid=5157, ip=10.0.0.2) INFO ...   (vLLM V1 and Ray, nested)
    re.compile(r"\((?:[A-Za-z_][\w.-]*(?: pid=\d+)?(?:, ip=[0-9a-fA-F.:]+)?)\) ?"),
    # [rank3]: Traceback (most recent call last):         (torchrun's per-rank prefix)
    # [vllm]: INFO 07-28 21:53:45 api_server.py:219] ...  (a container log viewer, akash-network/awesome-akash#543)
    re.compile(r"\[[\w.-]{1,40}\]: ?"),
    # > ERROR 03-10 ...                                   (a quoted mail)
    re.compile(r">+ ?"),
)
# Ray's own components: "(raylet) A worker died ...", "(autoscaler +41s) Error: ...", "(gcs_server) ..."
RAY_COMPONENT = re.compile(r"\((?:raylet|gcs_server|autoscaler|dashboard|monitor|log_monitor)[^)]{0,40}\) ?")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_CLIPPED = "|".join(sorted({lv[n:] for lv in _LEVELS for n in range(len(lv) - 1)}, key=len, reverse=True))
# ERROR 12-18 10:00:00 [core.py:123] msg; vLLM 0.5: "INFO 07-25 06:50:45 config.py:718] msg"; 0.32 shows a path
# (v1/.../core.py); a paste that lost the first letters: "RROR 12-18 10:00:00 [core.py:123] ..."
VLLM_HEAD = re.compile(
    rf"(?:{_CLIPPED}) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?(?:[\w.-]+/)*(?P<file>[\w.-]+\.py):\d+\] ?"
)
# ip-172-31-1-93:45294:45294 [0] NCCL INFO NET/IB : No device found.   (NVIDIA/nccl#226; host may be clipped)
NCCL_HEAD = re.compile(r"\S*:\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?NCCL (?:INFO|WARN|ERROR|TRACE|ABORT)\b")
# [E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught ...   (torch c10d, glog style)
# [E ProcessGroupNCCL.cpp:577] ...; terminate called after throwing an instance of 'c10::DistBackendError'
C10D_HEAD = re.compile(r"\[[IWEF]\d{0,4}[ \d:.]*[\w.]+\.(?:cpp|cc|h|hpp):\d+\]|\s*what\(\):  |terminate called after")
# [2026-11-30 02:06:41,232 W 22797 22797] (gcs_server) ...   and Ray's Python logging:
# 2024-07-25 06:50:45,878	INFO worker.py:1603 -- Connecting to existing Ray cluster ...   (vllm-project/vllm#6775)
RAY_HEAD = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+:\d+ -- "
)
# INFO:     127.0.0.1:52144 - "POST /v1/chat/completions HTTP/1.1" 200 OK   (uvicorn's access log)
# 127.0.0.1 [10/Mar/2025:15:07:20 +0000] "GET /api/jobs/ HTTP/1.1" 200 ...      (Ray dashboard, aiohttp)
ACCESS_LINE = re.compile(r"\"[A-Z]{3,10} \S* HTTP/\d(?:\.\d)?\"")
# vLLM's request logger (0.4: async_llm_engine.py "Received request %s: prompt: %r, sampling_params: ...";
# 0.6-0.10: entrypoints/logger.py "Received request %s: prompt: %r, params: ..."; 0.32: request_logger.py
# "Received request %s: params: %s", "Request %s details: prompt: %r", "Request %s JSON body: %s",
# "Generated response %s: output: %r"; v1/engine/async_llm.py "Added request %s.", "Aborted request(s) %s.").
REQUEST_RECORD = re.compile(
    r"(?:Received request|Generated response|Added request|Aborted request|Finished request)(?:\(s\))? "
    r"|Request \S+ (?:details|JSON body): "
)
REQUEST_LOGGERS = frozenset({"logger.py", "request_logger.py"})
# Files of vLLM's OpenAI-compatible server that log what a request sent (an invalid prompt, template, tool call).
CLIENT_SOURCE = re.compile(
    r"(?:serving\w*|api_server|api_router|protocol|chat_utils|run_batch|harmony\w*|\w*tool_parser\w*"
    r"|\w*reasoning_parser\w*|\w*renderer\w*|tool_server|responses_utils)\.py"
)
# A quoted span: 'text' or "text" (a prompt as %r prints it).
QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


# Whether any prefix may open a line (the same patterns, tried in one regex; all have the same flags).
_ANY_PREFIX = re.compile("|".join(f"(?:{p.pattern})" for p in PREFIXES))


def clean(line: str) -> str:
    """The record as its process printed it: the line without pasting artefacts (see the module docstring)."""
    text = line.replace("\r", "")
    if may_hold_colour(text):
        text = ANSI.sub("", text)
    text = text.lstrip()
    if _ANY_PREFIX.match(text) is None:  # most lines: one match of the alternation instead of one a prefix
        return text
    for _ in range(MAX_PREFIXES):
        for prefix in PREFIXES:
            m = prefix.match(text)
            if m is not None and m.end() < len(text):
                text = text[m.end() :]
                break
        else:
            return text
    return text


def may_hold_colour(text: str) -> bool:
    """False when ``ANSI`` cannot match in ``text``: ``clean`` of such a line without a carriage return only cuts
    a prefix off it, so what is left is a part of the line as it was."""
    return "\x1b" in text or ANSI_HINT.search(text) is not None


class Shape(Struct, frozen=True):
    """Who printed a cleaned line: ``message`` is where its text starts, ``head`` whether it opens a record."""

    trust: Trust
    message: int
    head: bool


def shape(text: str) -> Shape:
    """The record shape of one cleaned line, on its own (``judge.scan`` adds what the lines before it say)."""
    ray = RAY_COMPONENT.match(text)
    if ray is not None:
        rest = text[ray.end() :]
        inner = shape(clean(rest))
        if inner.trust is Trust.DENIED:
            return inner
        return Shape(Trust.TRUSTED, 0, True)
    if ACCESS_LINE.search(text):
        return Shape(Trust.DENIED, 0, True)
    vllm = VLLM_HEAD.match(text)
    if vllm is not None:
        msg = text[vllm.end() :]
        if vllm["file"] in REQUEST_LOGGERS or REQUEST_RECORD.match(msg):
            return Shape(Trust.DENIED, vllm.end(), True)
        client = CLIENT_SOURCE.fullmatch(vllm["file"]) is not None
        return Shape(Trust.CLIENT if client else Trust.TRUSTED, vllm.end(), True)
    if REQUEST_RECORD.match(text):
        return Shape(Trust.DENIED, 0, True)
    for head in (NCCL_HEAD, C10D_HEAD, RAY_HEAD):
        if head.match(text):
            return Shape(Trust.TRUSTED, 0, True)
    return Shape(Trust.TRUSTED, 0, False)


def inside_quotes(text: str, start: int, end: int) -> bool:
    """True when ``text[start:end]`` lies within one quoted span (what a prompt looks like in a log record)."""
    return any(q.start() < start and end <= q.end() for q in QUOTED.finditer(text))

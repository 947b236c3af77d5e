"""Failures nobody catalogued: a line the signature catalog does not know but that is plainly a failure.

A fallback pass after the catalog (``judge.scan``) and the traceback frames (``judge.frames``), for ``diagnose``: a
Python exception line (a traceback's last line: ``RuntimeError: ...``, ``safetensors_rust.SafetensorError: ...``),
``CUDA error:``, a ``CUBLAS_STATUS_`` status other than success, ``NCCL error``, an ``ERROR`` or ``CRITICAL`` record
of vLLM, Ray, PyTorch or Python's logging, a kernel record at ``err`` priority or above (``<3>`` of ``dmesg -r``, a
``/dev/kmsg`` record's ``3,seq,usec,-;``). Each distinct message (numbers and addresses aside) is one WARNING
finding ``UNCATALOGUED_ERROR`` quoting its first line and counting its lines: never an action, since production logs
carry ERROR lines all day (client errors, aborted requests), but never "ok" either.

What is not a failure stays silent: an INFO or WARNING record (``finished_reason="error"`` in a metric name), a
``--help`` text, a ``raise ValueError(...)`` line of a traceback's source.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.result import Finding, Status

UNCATALOGUED_ERROR = "UNCATALOGUED_ERROR"
# Distinct messages reported, at most: the rest are counted in the last one's words.
MAX_FINDINGS = 20
QUOTE_CHARS = 300

# What a line may carry before its record: Ray's or vLLM's process prefix "(RayWorkerWrapper pid=1, ip=10.0.0.5) ",
# "(EngineCore_DP0 pid=123) ", up to three of them.
_PROCESS = r"(?:\([^()\n]{1,200}\) ?){0,3}"
PLAIN_FAILURE_RE = lazy_compile(
    r"^" + _PROCESS + r"(?:"
    # A Python exception as a traceback ends: "RuntimeError: CUDA error: device-side assert triggered",
    # "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge".
    r"(?:[A-Za-z_]\w{0,60}\.){0,6}[A-Z]\w{0,60}(?:Error|Exception)(?::[ \t].{0,2000})?[ \t]*$"
    # vLLM: "ERROR 12-07 20:30:45 worker_base.py:480] ..." (and "[worker_base.py:480]" since 0.8).
    r"|(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
    # Ray's Python logging: "2024-07-25 06:50:45,878\tERROR worker.py:1603 -- ...".
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{1,6}\s{1,4}(?:ERROR|CRITICAL) [\w.]{1,80}:\d{1,6} -- "
    # Ray's C++ logs and glog/c10 (PyTorch): "[2026-11-30 02:06:41,232 E 22797 22797] ...", "E1205 08:00:01.123456",
    # "[rank0]:[E1205 08:00:01.123456 ...]", "[E ProcessGroupNCCL.cpp:828] ...".
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{1,6} [EF] \d{1,10} \d{1,10}\]"
    r"|(?:\[rank\d{1,6}\]:)?\[?[EF]\d{4} \d\d:\d\d:\d\d\.\d{1,9} "
    r"|\[[EF] [\w.]{1,80}:\d{1,6}\]"
    # Python's logging: "ERROR:root:...", "2024-07-25 06:50:45,878 - vllm - ERROR - ...".
    r"|(?:ERROR|CRITICAL):[\w.]{1,80}:"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d{1,6} - (?:[\w.]{1,80} - )?(?:ERROR|CRITICAL) - "
    # The kernel at err, crit, alert or emerg: "<3>[ 1.234] ..." (dmesg -r), "3,1234,5678,-;..." (/dev/kmsg,
    # facility 0: the kernel's own).
    r"|<[0-3]>"
    r"|[0-3],\d{1,20},\d{1,20},[^;\n]{0,40};"
    r")"
    # Anywhere in a line: CUDA's and cuBLAS's and NCCL's own words for a failure.
    r"|\bCUDA error: |\bCUBLAS_STATUS_(?!SUCCESS\b)[A-Z_]{4,40}\b|\bNCCL [Ee]rror\b",
    re.MULTILINE,
)
# A message's identity: its words, without the numbers, addresses and stamps that differ between its lines.
_VARYING_RE = lazy_compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+")


# A multi-line record repeats its head on every line: "(APIServer pid=1) ERROR 11-30 16:11:51 [async_llm.py:906] ".
_RECORD_HEAD_RE = lazy_compile(
    r"^" + _PROCESS + r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d[^\]\n]{0,120}\] "
)
_TRACEBACK = "Traceback (most recent call last):"


def _blocks(lines: Sequence[str]) -> list[int]:
    """The block of each line: a multi-line record (its head repeated) or a bare traceback through its exception
    line; a line of neither is its own block. Blocks are numbered by their first line."""
    owner: list[int] = []
    head: str | None = None
    start = 0
    in_traceback = False
    for index, line in enumerate(lines):
        found = _RECORD_HEAD_RE.match(line)
        this = found[0] if found else None
        body = line[len(this) :] if this else line.lstrip()
        if not ((this is not None and this == head) or (in_traceback and this is None)):
            start, head, in_traceback = index, this, False
        owner.append(start)
        if body.startswith(_TRACEBACK):
            in_traceback = True
        elif in_traceback and this is None and line[:1] not in (" ", "\t"):
            in_traceback = False  # the exception line ends a bare traceback; it belongs to it
    return owner


def uncatalogued_findings(
    lines: Sequence[str], matched: Collection[int], known: Callable[[str], bool] | None = None
) -> list[Finding]:
    """One WARNING per distinct plain failure among ``lines`` that the catalog did not name, in order of first
    appearance. ``matched``: the 0-based indexes of the lines the catalog named; ``known``: whether the catalog knows
    a line at all (it may have read it as benign in its context: a requested stop's EngineDeadError). A record or
    traceback of which the catalog named or knows one line is the catalog's, whole."""
    text = "\n".join(lines)
    if PLAIN_FAILURE_RE.search(text) is None:
        return []
    owner = _blocks(lines)
    members: dict[int, list[int]] = {}
    for index, block in enumerate(owner):
        members.setdefault(block, []).append(index)
    theirs = {owner[i] for i in matched if 0 <= i < len(owner)}
    first: dict[str, tuple[int, str]] = {}
    counts: dict[str, int] = {}
    number, pos = 0, 0
    seen_line = -1
    for match in PLAIN_FAILURE_RE.finditer(text):
        number += text.count("\n", pos, match.start())
        pos = match.start()
        if number == seen_line:
            continue
        seen_line = number
        block = owner[number]
        if block in theirs:
            continue
        if known is not None and any(known(lines[i]) for i in members[block]):
            theirs.add(block)
            continue
        line = lines[number].strip()
        key = _VARYING_RE.sub("N", _message(line))
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, (number, line))
    out = []
    for key, (index, line) in sorted(first.items(), key=lambda kv: kv[1][0])[:MAX_FINDINGS]:
        quoted = line if len(line) <= QUOTE_CHARS else line[:QUOTE_CHARS] + "..."
        out.append(
            Finding(
                UNCATALOGUED_ERROR,
                Status.WARNING,
                f"an error the catalog does not know, {counts[key]} line(s): {quoted}",
                f"line {index + 1}",
                evidence=line[:500],
                remedy="read the line and what precedes it: dgxdoctor's catalog does not name this failure yet",
            )
        )
    return out


# The stamp and level a record starts with, left out of a message's identity with the process prefix.
_HEAD_RE = lazy_compile(r"^(?:\([^()\n]{1,200}\) ?){0,3}(?:\S{0,40}\d\d:\d\d:\d\d\S{0,20} ){0,2}")


def _message(line: str) -> str:
    return _HEAD_RE.sub("", line)

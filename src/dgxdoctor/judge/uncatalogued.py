"""Failures nobody catalogued: a line the signature catalog does not know but that is plainly a failure.

A fallback pass after the catalog (``judge.scan``) and the traceback frames (``judge.frames``), for ``diagnose``: a
Python exception line (a traceback's last line: ``RuntimeError: ...``, ``safetensors_rust.SafetensorError: ...``),
``CUDA error:``, a ``CUBLAS_STATUS_`` status other than success, ``NCCL error``, an ``ERROR`` or ``CRITICAL`` record
of vLLM, Ray, PyTorch or Python's logging, a kernel record at ``err`` priority or above (``<3>`` of ``dmesg -r``, a
``/dev/kmsg`` record's ``3,seq,usec,-;``). Each distinct message (numbers and addresses aside) is one WARNING
finding ``UNCATALOGUED_ERROR`` quoting its first line and counting its lines: never an action, since production logs
carry ERROR lines all day (client errors, aborted requests), but never "ok" either.

What is not a failure stays silent: an INFO or WARNING record (``finished_reason="error"`` in a metric name), a
``--help`` text, a ``raise ValueError(...)`` line of a traceback's source, the lines judge/benign.py names (a
healthy boot's kernel records at err priority, each with its reason), and a line in the 60 after a requested stop
began (judge/shutdown.py: the stop's echo).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import cache
from typing import NamedTuple, Protocol, cast

from dgxdoctor.judge.benign import known_benign
from dgxdoctor.judge.shutdown import intended_stop_before
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.result import Finding, Status

UNCATALOGUED_ERROR = "UNCATALOGUED_ERROR"
# Distinct messages reported, at most: the rest are counted in the last one's words.
MAX_FINDINGS = 20
QUOTE_CHARS = 300

# What a line may carry before its record: Ray's or vLLM's process prefix "(RayWorkerWrapper pid=1, ip=10.0.0.5) ",
# "(EngineCore_DP0 pid=123) ", up to three of them.
_PROCESS = r"(?:\([^()\n]{1,200}\) ?){0,3}"
_LINE_START = (
    r"^" + _PROCESS + r"(?:"
    # A Python exception as a traceback ends: "RuntimeError: CUDA error: device-side assert triggered",
    # "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge".
    r"(?:[A-Za-z_]\w{0,60}\.){0,6}[A-Z]\w{0,60}(?:Error|Exception)(?::[ \t].{0,1000})?[ \t]*$"
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
)
# Anywhere in a line: CUDA's and cuBLAS's and NCCL's own words for a failure (cuBLAS's success aside).
_ANYWHERE = r"\bCUDA error: |\bCUBLAS_STATUS_{ok}[A-Z_]{{4,40}}\b|\bNCCL [Ee]rror\b"
PLAIN_FAILURE_RE = lazy_compile(_LINE_START + "|" + _ANYWHERE.format(ok=r"(?!SUCCESS\b)"), re.MULTILINE)


class _Search(Protocol):
    def finditer(self, data: bytes) -> Iterator[re.Match[bytes]]: ...


@cache
def _candidates() -> _Search:
    """The same over the whole text's bytes at once, with RE2's automaton (linear; Python's engine tries every
    alternative at every place): it finds the lines to look at, ``PLAIN_FAILURE_RE`` decides on each."""
    source = ("(?m)" + _LINE_START + "|" + _ANYWHERE.format(ok="")).encode()
    try:
        import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]

        options = re2.Options()
        options.max_mem = 64 << 20
        options.log_errors = False
        return cast(_Search, re2.compile(source, options))
    except Exception:  # no RE2, or a pattern it refuses: Python's engine, slower, same lines
        return re.compile(source)


# A message's identity: its words, without the numbers, addresses and stamps that differ between its lines.
_VARYING_RE = lazy_compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+")


# A multi-line record repeats its head on every line: "(APIServer pid=1) ERROR 11-30 16:11:51 [async_llm.py:906] ".
_RECORD_HEAD_RE = lazy_compile(
    r"^" + _PROCESS + r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d[^\]\n]{0,120}\] "
)
_TRACEBACK = "Traceback (most recent call last):"


def shows_plain_failure(text: str) -> bool:
    """Whether any line of ``text`` is a plain failure (before the catalog has read it: ``diagnose``'s detection)."""
    data = text.encode("utf-8", errors="replace")
    for match in _candidates().finditer(data):
        start = data.rfind(b"\n", 0, match.start()) + 1
        end = data.find(b"\n", match.start())
        line = data[start : end if end >= 0 else len(data)].decode("utf-8", errors="replace")
        if PLAIN_FAILURE_RE.search(line) is not None:
            return True
    return False


def _head(line: str) -> str | None:
    found = _RECORD_HEAD_RE.match(line)
    return found[0] if found else None


def _block(lines: Sequence[str], index: int) -> range:
    """The lines of the record or traceback ``lines[index]`` belongs to: a multi-line record repeats its head on
    every line; a bare traceback runs from its ``Traceback`` line through its exception line. Else the line alone."""
    head = _head(lines[index])
    start = end = index
    if head is not None:
        while start > 0 and lines[start - 1].startswith(head):
            start -= 1
        while end + 1 < len(lines) and lines[end + 1].startswith(head):
            end += 1
        return range(start, end + 1)
    while start > 0 and lines[start - 1][:1] in (" ", "\t") and _head(lines[start - 1]) is None:
        start -= 1
    if start > 0 and lines[start - 1].lstrip().startswith(_TRACEBACK):
        return range(start - 1, index + 1)
    return range(index, index + 1)


class Unknown(NamedTuple):
    """One distinct plain failure: the index of its first line, that line, and how many lines said it."""

    at: int
    line: str
    times: int


def uncatalogued_findings(
    lines: Sequence[str], matched: Collection[int], known: Callable[[str], bool] | None = None
) -> list[Finding]:
    """One WARNING per distinct plain failure among ``lines`` that the catalog did not name (``uncatalogued``)."""
    out = []
    for index, line, count in uncatalogued(lines, matched, known)[:MAX_FINDINGS]:
        quoted = line if len(line) <= QUOTE_CHARS else line[:QUOTE_CHARS] + "..."
        out.append(
            Finding(
                UNCATALOGUED_ERROR,
                Status.WARNING,
                f"an error the catalog does not know, {count} line(s): {quoted}",
                f"line {index + 1}",
                evidence=line[:500],
                remedy="read the line and what precedes it: dgxdoctor's catalog does not name this failure yet",
            )
        )
    return out


def uncatalogued(
    lines: Sequence[str], matched: Collection[int], known: Callable[[str], bool] | None = None
) -> list[Unknown]:
    """The distinct plain failures among ``lines`` that the catalog did not name, in order of first
    appearance. ``matched``: the 0-based indexes of the lines the catalog named; ``known``: whether the catalog knows
    a line at all (it may have read it as benign in its context: a requested stop's EngineDeadError). A record or
    traceback of which the catalog named or knows one line is the catalog's, whole."""
    data = "\n".join(lines).encode("utf-8", errors="replace")
    blocks: dict[int, range] = {}
    theirs: set[int] = set()  # blocks (by first line) the catalog named or knows
    cleared: set[int] = set()  # blocks it does not know
    known_keys: dict[str, bool] = {}
    first: dict[str, tuple[int, str]] = {}
    counts: dict[str, int] = {}
    number, pos = 0, 0
    seen_line = -1
    for match in _candidates().finditer(data):
        number += data.count(b"\n", pos, match.start())
        pos = match.start()
        if number == seen_line or number >= len(lines):
            continue
        seen_line = number
        if PLAIN_FAILURE_RE.search(lines[number]) is None:  # cuBLAS's success: the one thing RE2 cannot tell
            continue
        if known_benign(lines[number]) is not None:  # a healthy boot's line at err priority (judge.benign)
            continue
        block = blocks.get(number)
        if block is None:
            block = _block(lines, number)
            blocks.update(dict.fromkeys(block, block))
        if block.start in theirs:
            continue
        line = lines[number].strip()
        key = _VARYING_RE.sub("N", _message(line))
        if block.start not in cleared:
            if any(i in matched for i in block):
                theirs.add(block.start)
                continue
            alone = len(block) == 1  # a one-line record: its message decides, as it did for its like before
            is_known = known_keys.get(key) if alone else None
            if is_known is None:
                is_known = known is not None and any(known(lines[i]) for i in block)
                if alone:
                    known_keys[key] = is_known
            if is_known:
                theirs.add(block.start)
                continue
            cleared.add(block.start)
        if intended_stop_before(lines, number):  # the echo of a requested stop (judge.shutdown); last: it reads 60
            continue  # lines back
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, (number, line))
    return [Unknown(index, line, counts[key]) for key, (index, line) in sorted(first.items(), key=lambda kv: kv[1][0])]


# The stamp and level a record starts with, left out of a message's identity with the process prefix.
_HEAD_RE = lazy_compile(r"^(?:\([^()\n]{1,200}\) ?){0,3}(?:\S{0,40}\d\d:\d\d:\d\d\S{0,20} ){0,2}")


def _message(line: str) -> str:
    return _HEAD_RE.sub("", line)

"""A traceback cut before its exception line still names the function that failed: frames as weaker evidence.

A paste often ends inside the traceback (a chat message's length limit, a terminal scrolled away, the first screen
of a log), so the line the catalog knows never arrives. The frames say where it stopped: vLLM's
``raise_if_cache_size_invalid`` only raises when the KV cache is too small, Ray's ``_execute_until`` only while it
waits on a compiled-graph channel. Such a reading is a guess: it is reported as "likely", at WARNING at most, and
only when no catalog line follows the frames (the exception line, when present, is the better evidence).

The rules live beside the signatures, as ``[[frame]]`` tables in ``data/signatures.toml``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from msgspec import Struct

from dgxdoctor.compat import tomllib
from dgxdoctor.judge.signatures import CatalogError, Signature, load_catalog
from dgxdoctor.result import Finding, Status

# [rank4]:   File "/mnt/.../minillm/transformers/src/transformers/mpu/utils.py", line 11, in ensure_divisibility
#   (microsoft/LMOps#292: Python's traceback format; the prefix is whatever the log put before it)
# (RayWorkerWrapper pid=336, ip=10.99.48.129)   File ".../device_communicators/pynccl.py", line 99 in __init__
#   (vllm-project/vllm#15687: faulthandler's format, no comma)
FRAME = re.compile(r'File "(?P<path>[^"\n]+)", line \d+,? in (?P<func>[\w<>.]+)')


class FrameRule(Struct, frozen=True):
    """The code a traceback stands for when its frames pass through ``steps`` in order (``path:function`` or
    ``function``; a path matches by its ending, so ``channel/common.py:read`` is Ray's channel read)."""

    code: str
    steps: tuple[tuple[str, str], ...]

    def first_step_at(self, frames: Sequence[tuple[int, str, str]]) -> tuple[int, int] | None:
        """(first, last) line index of the frames that take every step in order, or None. A Python traceback
        lists the outermost call first, faulthandler's dump the innermost: either order counts."""
        return self._walk(frames) or self._walk(frames[::-1])

    def _walk(self, frames: Sequence[tuple[int, str, str]]) -> tuple[int, int] | None:
        want = 0
        seen: list[int] = []
        for index, path, func in frames:
            suffix, name = self.steps[want]
            if func == name and path.endswith(suffix):
                seen.append(index)
                want += 1
                if want == len(self.steps):
                    return min(seen), max(seen)
        return None


def parse_rules(data: Mapping[str, Any], codes: Collection[str], source: str = "<catalog>") -> tuple[FrameRule, ...]:
    rules = []
    for index, entry in enumerate(data.get("frame", [])):
        where = f"{source}: frame[{index}]"
        code, steps = entry.get("code"), entry.get("steps")
        if code not in codes:
            raise CatalogError(f"{where}: code must name a signature, got {code!r}")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s for s in steps):
            raise CatalogError(f"{where}: steps must be a non-empty list of 'path:function' or 'function'")
        if set(entry) - {"code", "steps"}:
            raise CatalogError(f"{where}: unknown keys {sorted(set(entry) - {'code', 'steps'})}")
        rules.append(FrameRule(code, tuple(_step(s) for s in steps)))
    return tuple(rules)


def _step(text: str) -> tuple[str, str]:
    path, _, func = text.rpartition(":")
    return path, func


@cache
def load_rules() -> tuple[FrameRule, ...]:
    text = resources.files("dgxdoctor").joinpath("data/signatures.toml").read_text(encoding="utf-8")
    return parse_rules(tomllib.loads(text), load_catalog().by_code(), "dgxdoctor/data/signatures.toml")


def frames_of(lines: Sequence[str]) -> list[tuple[int, str, str]]:
    """(line index, file path, function) of every traceback frame line."""
    found = []
    for index, line in enumerate(lines):
        if "File " in line and (m := FRAME.search(line)) is not None:
            found.append((index, m["path"], m["func"]))
    return found


def frame_findings(
    lines: Sequence[str],
    matched: Collection[int],
    signatures: Mapping[str, Signature],
    rules: Sequence[FrameRule] | None = None,
) -> list[Finding]:
    """Findings ("likely ...") for tracebacks whose frames a rule knows and after which no catalog line (``matched``
    holds the indexes of the lines the catalog named) gives the exception itself."""
    frames = frames_of(lines)
    if not frames:
        return []
    last_match = max(matched, default=-1)
    findings: dict[str, Finding] = {}
    for rule in rules if rules is not None else load_rules():
        span = rule.first_step_at(frames)
        if span is None or last_match >= span[0] or rule.code in findings:
            continue
        sig = signatures[rule.code]
        func = rule.steps[-1][1]
        findings[rule.code] = Finding(
            rule.code,
            Status.WARNING,
            f"likely {rule.code}: the traceback stops in {func} before its exception line. {sig.meaning}",
            f"line {span[1] + 1}",
            evidence=lines[span[1]].strip()[:500],
            remedy=sig.fix,
        )
    return list(findings.values())

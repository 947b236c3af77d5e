"""The catalog of known failure signatures (data in ``dgxdoctor/data/signatures.toml``) and a fast line matcher.

``load_catalog()`` validates the data and precompiles every pattern; ``Catalog.match(line, kind)`` returns the
signatures a log line shows. Most log lines match nothing, so one combined regex of all patterns is tried first
and the per-signature regexes run only on the rare line it hits: scanning a large log costs one regex search per
line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from dgxdoctor.result import Status

SEVERITIES: Mapping[str, Status] = {"warning": Status.WARNING, "critical": Status.CRITICAL}
LOG_KINDS = ("vllm", "ray")
# Only the start of a line is matched: every signature sits in the first few hundred characters, and a bound
# keeps a pathological megabyte-long line from costing more than an ordinary one.
MAX_MATCH_CHARS = 16384
_CODE = re.compile(r"^[A-Z][A-Z0-9_]*$")


class CatalogError(ValueError):
    """The signature data is malformed; the message names the signature and key."""


@dataclass(frozen=True)
class Signature:
    code: str
    severity: Status
    kinds: tuple[str, ...]
    meaning: str
    fix: str
    patterns: tuple[re.Pattern[str], ...]
    # The broader signature this one replaces on a line both match (CUDA_OOM_STARTUP refines CUDA_OOM).
    refines: str | None = None


def _scoped(pattern: re.Pattern[str]) -> str:
    """The pattern as a group of the combined prefilter; a leading ``(?i)`` becomes a scoped ``(?i:...)``."""
    source = pattern.pattern
    if source.startswith("(?i)"):
        return f"(?i:{source[4:]})"
    return f"(?:{source})"


@dataclass(frozen=True)
class Match:
    signature: Signature
    line: str

    @property
    def code(self) -> str:
        return self.signature.code


class Catalog:
    def __init__(self, signatures: Iterable[Signature]) -> None:
        self.signatures: tuple[Signature, ...] = tuple(signatures)
        # Non-capturing alternation of every pattern: the cheap first pass.
        combined = "|".join(_scoped(p) for s in self.signatures for p in s.patterns)
        self._prefilter = re.compile(combined) if combined else None

    def by_code(self) -> dict[str, Signature]:
        return {s.code: s for s in self.signatures}

    def match(self, line: str, kind: str | None = None) -> list[Match]:
        """Signatures whose patterns occur in ``line`` (restricted to those applying to ``kind``, if given)."""
        line = line[:MAX_MATCH_CHARS]
        if self._prefilter is None or self._prefilter.search(line) is None:
            return []
        found = [
            sig
            for sig in self.signatures
            if (kind is None or kind in sig.kinds) and any(p.search(line) for p in sig.patterns)
        ]
        refined = {sig.refines for sig in found if sig.refines}
        return [Match(sig, line) for sig in found if sig.code not in refined]

    def scan(self, text: str, kind: str | None = None) -> list[Match]:
        """Every match in a block of text, line by line, in order."""
        found: list[Match] = []
        for line in text.splitlines():
            found.extend(self.match(line, kind))
        return found


def parse_catalog(data: Mapping[str, Any], source: str = "<catalog>") -> Catalog:
    entries = data.get("signature")
    if not isinstance(entries, list) or not entries:
        raise CatalogError(f"{source}: no [[signature]] entries")
    signatures: list[Signature] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{source}: signature[{index}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"{where}: not a table")
        code = entry.get("code")
        if not isinstance(code, str) or not _CODE.match(code):
            raise CatalogError(f"{where}: code must be UPPER_SNAKE, got {code!r}")
        where = f"{source}: {code}"
        if code in seen:
            raise CatalogError(f"{where}: duplicate code")
        seen.add(code)
        severity = entry.get("severity")
        if not isinstance(severity, str) or severity not in SEVERITIES:
            raise CatalogError(f"{where}: severity must be one of {sorted(SEVERITIES)}, got {severity!r}")
        kinds = entry.get("kinds")
        if not isinstance(kinds, list) or not kinds or any(k not in LOG_KINDS for k in kinds):
            raise CatalogError(f"{where}: kinds must be a non-empty list of {list(LOG_KINDS)}, got {kinds!r}")
        texts = {}
        for key in ("meaning", "fix"):
            value = entry.get(key)
            if not isinstance(value, str) or not value.strip():
                raise CatalogError(f"{where}: {key} must be a non-empty string")
            texts[key] = value.strip()
        refines = entry.get("refines")
        if refines is not None and (not isinstance(refines, str) or not _CODE.match(refines)):
            raise CatalogError(f"{where}: refines must name a signature code, got {refines!r}")
        raw_patterns = entry.get("patterns", [] if refines else None)
        if not isinstance(raw_patterns, list) or not (raw_patterns or refines):
            raise CatalogError(f"{where}: patterns must be a non-empty list")
        compiled = [_compile(raw, where) for raw in raw_patterns]
        unknown = set(entry) - {"code", "severity", "kinds", "meaning", "fix", "patterns", "refines"}
        if unknown:
            raise CatalogError(f"{where}: unknown keys {sorted(unknown)}")
        signatures.append(
            Signature(
                code, SEVERITIES[severity], tuple(kinds), texts["meaning"], texts["fix"], tuple(compiled), refines
            )
        )
    for sig in signatures:
        if sig.refines is not None and sig.refines not in seen:
            raise CatalogError(f"{source}: {sig.code}: refines unknown signature {sig.refines!r}")
    return Catalog(signatures)


def _compile(raw: object, where: str) -> re.Pattern[str]:
    if not isinstance(raw, str) or not raw:
        raise CatalogError(f"{where}: pattern {raw!r} is not a non-empty string")
    try:
        pattern = re.compile(raw)
    except re.error as exc:
        raise CatalogError(f"{where}: pattern {raw!r} does not compile: {exc}") from None
    if pattern.groupindex:
        # Named groups would collide in the combined prefilter.
        raise CatalogError(f"{where}: pattern {raw!r} must not use named groups")
    if pattern.flags & ~(re.UNICODE | re.IGNORECASE) or ("(?" in raw and raw.find("(?i)") > 0):
        # Only a leading (?i) can be scoped inside the combined prefilter.
        raise CatalogError(f"{where}: pattern {raw!r} may use no inline flag but a leading (?i)")
    return pattern


@cache
def load_catalog() -> Catalog:
    """The catalog shipped with the package (parsed and compiled once per process)."""
    text = resources.files("dgxdoctor").joinpath("data/signatures.toml").read_text(encoding="utf-8")
    return parse_catalog(tomllib.loads(text), "dgxdoctor/data/signatures.toml")

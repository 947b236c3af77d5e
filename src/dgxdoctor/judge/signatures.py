"""The catalog of known failure signatures (data in ``dgxdoctor/data/signatures.toml``) and its matcher.

``load_catalog()`` validates the data and precompiles every pattern. ``Catalog.find(text)`` returns the
signatures a cleaned record's text shows; ``Catalog.match(line)`` reads one raw line as the record it is first
(``judge.records``: the paste normaliser, and no signature from a request or access-log record, or from quoted
text of a client record); ``judge.scan`` (``scan_text``, ``Scanner``) reads many lines, fast.

Most log lines match nothing, so one combined regex of every pattern's anchor (a run of literal text every
matching line contains, from a capital letter where that leaves 10 characters; for a ``(?i)`` pattern its lower,
Capitalised and UPPER forms), built as a prefix tree, is tried first, and the per-signature regexes run only on
the rare line it hits. Over a block of raw bytes the same tree also accepts a line break between two characters
(a wrapped record) and runs in RE2 where ``google-re2`` is installed. On a line it hits, one RE2 ``Set`` of every
prefilter form and of every whole pattern (``judge.line_set``) says in one pass which patterns can match, so a
line's cost does not grow with how many signatures share a word with it; ``may_match`` says a text matches none.
A pattern is searched cut at its top-level ``.*`` (``_gap_pieces``), so a long line costs linear time.

The data's schema is unchanged by the record-shape rules: they are code (``judge.records``), not keys, so a
signature needs nothing new to be matched only in the records that print it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache, cached_property
from importlib import resources
from typing import Any, Protocol, cast

from msgspec import Struct

from dgxdoctor.compat import tomllib
from dgxdoctor.judge.consequence import judged
from dgxdoctor.judge.line_set import LineSet
from dgxdoctor.result import Finding, Status

SEVERITIES: Mapping[str, Status] = {"warning": Status.WARNING, "critical": Status.CRITICAL}
LOG_KINDS = ("vllm", "ray")
# Only the start of a line is matched: every signature sits in the first few hundred characters, and a bound
# keeps a pathological megabyte-long line from costing more than an ordinary one.
MAX_MATCH_CHARS = 16384
_CODE = re.compile(r"^[A-Z][A-Z0-9_]*$")


class CatalogError(ValueError):
    """The signature data is malformed; the message names the signature and key."""


class Signature(Struct, frozen=True):
    code: str
    severity: Status
    kinds: tuple[str, ...]
    meaning: str
    fix: str
    patterns: tuple[re.Pattern[str], ...]
    # The broader signature this one replaces on a line both match (CUDA_OOM_STARTUP refines CUDA_OOM).
    refines: str | None = None

    def finding(self, subject: str | None, evidence: str, lines: int = 1) -> Finding:
        """The finding of a match: ``evidence`` the line (cut by the caller), ``lines`` how many lines showed it; with
        what follows from it (judge.consequence)."""
        times = f" ({lines} lines)" if lines > 1 else ""
        return judged(Finding(self.code, self.severity, self.meaning + times, subject, evidence, self.fix))


MIN_ANCHOR = 4
# A capitalised tail shorter than this is too common to stand for its run ("KV cache", "Progress"); a run shorter
# than this loses to a longer one of the same pattern ("CUDA" is in every line of vLLM's graph capture).
RARE_MIN = 10
# Text that every line of one kind carries: NCCL prints "NCCL WARN" on each of its warnings. A pattern anchored on
# it alone sent every NCCL warning through the per-line reading, 80 times the cost of plain text (issue 34); the
# catalog refuses such an anchor.
LINE_MARKERS = frozenset({"NCCL", "NCCL INFO", "NCCL WARN", "NCCL ERROR"})


def _literal_runs(source: str) -> list[str]:
    """The runs of literal characters outside any group or class of a pattern. Escaped punctuation counts as
    literal; a character made optional by ``?``, ``*`` or ``{`` does not."""
    src = source.removeprefix("(?i)")
    runs: list[str] = []
    run = ""
    depth = i = 0
    while i < len(src):
        ch = src[i]
        if ch == "\\":
            nxt = src[i + 1 : i + 2]
            if depth == 0 and nxt and not nxt.isalnum():
                run += nxt
            else:
                runs, run = [*runs, run], ""
            i += 2
            continue
        if ch == "[":
            runs, run = [*runs, run], ""
            close = src.find("]", i + 2)
            i = close + 1 if close != -1 else len(src)
            continue
        if ch in "?*{":
            runs, run = [*runs, run[:-1]], ""
            if ch == "{":
                close = src.find("}", i)
                i = close if close != -1 else len(src)
        elif ch in "()+.^$|":
            runs, run = [*runs, run], ""
            depth += {"(": 1, ")": -1}.get(ch, 0)
        elif depth == 0:
            run += ch
        i += 1
    return [r.strip() for r in [*runs, run] if r.strip()]


def _rare_start(run: str) -> str:
    """The run from its first capital letter on, when that leaves enough: at most positions of ordinary text the
    prefilter then fails on the first character (lower-case letters are everywhere, capitals are not)."""
    for n, ch in enumerate(run):
        if ch.isupper():
            return run[n:] if len(run) - n >= RARE_MIN else run
    return run


def anchor(source: str) -> str:
    """Literal text every line that matches the pattern contains: the longest literal run, preferring one that is
    no line marker (``LINE_MARKERS``), then one of ``RARE_MIN`` characters or more, then one that starts with a
    capital letter or punctuation (see ``_rare_start``)."""
    runs = [_rare_start(r) for r in _literal_runs(source)]
    usable = [r for r in runs if len(r) >= MIN_ANCHOR] or runs or [""]
    return max(usable, key=lambda r: (r not in LINE_MARKERS, len(r) >= RARE_MIN, not r[:1].islower(), len(r)))


# Between two characters of an anchor the prefilter also accepts a line break, and a space may be one: a record
# that a mail client, a Markdown editor or a terminal wrapped is still found (``judge.scan`` joins the two lines).
_GAP = r"(?:\r?\n)?"
_SPACE = r"(?: ?\r?\n| )"


def _trie_regex(words: Iterable[str], *, gaps: bool = False) -> str:
    """One regex of literal words as a prefix tree: at each position one character decides the branch. With
    ``gaps``, a line break may sit between two characters (a wrapped line)."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        branches = []
        for ch, child in sorted(node.items()):
            if not ch:
                continue
            rest = build(child)
            char = _SPACE if ch == " " and gaps else re.escape(ch)
            branches.append(char + (_GAP + rest if gaps and rest and ch != " " else rest))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:
            return "(?:" + body + ")?"
        return body

    return build(trie)


def _anchor_forms(source: str) -> set[str]:
    """What the prefilter looks for: the anchor as written, and for a case-insensitive pattern the usual casings."""
    text = anchor(source)
    if not source.startswith("(?i)"):
        return {text}
    first, _, rest = text.partition(" ")
    low = text.lower()
    return {low, low[:1].upper() + low[1:], text.upper(), (first.upper() + " " + rest.lower()).strip()}


def _top_level(body: str) -> Iterator[int]:
    """The positions of ``body`` outside escapes, character classes and groups: where ``|`` and ``.*`` split."""
    depth = i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            close = body.find("]", i + 2)
            i = close + 1 if close != -1 else len(body)
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            yield i
        i += 1


def _gap_pieces(source: str) -> list[str]:
    """The pattern cut at each top-level ``.*``: searched piece after piece, a line costs linear time.

    ``A.*B`` as one regex retries ``.*`` from every place ``A`` occurs (a 16 KiB line of repeated ``NCCL WARN``
    took 147 ms); ``A`` then ``B`` after it gives the same answer for the catalog's patterns, whose pieces are
    literal text. A pattern with a top-level alternation is kept whole.
    """
    flag, body = ("(?i)", source[4:]) if source.startswith("(?i)") else ("", source)
    if _top_level_alternation(source):
        return [source]
    pieces: list[str] = []
    last = 0
    for i in _top_level(body):
        if i < last:
            continue  # inside the ``.*`` (or ``.*?``) just cut
        if body.startswith(".*", i):
            pieces.append(body[last:i])
            last = i + (3 if body.startswith(".*?", i) else 2)
    pieces.append(body[last:])
    return [flag + p for p in pieces if p]


def _top_level_alternation(source: str) -> bool:
    body = source.removeprefix("(?i)")
    return any(body[i] == "|" for i in _top_level(body))


class _Searcher:
    """One catalog pattern, searched in linear time (see ``_gap_pieces``)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pieces = tuple(re.compile(p) for p in _gap_pieces(pattern.pattern))

    def span(self, text: str) -> tuple[int, int] | None:
        pos = start = 0
        for n, piece in enumerate(self.pieces):
            m = piece.search(text, pos)
            if m is None:
                return None
            start = m.start() if n == 0 else start
            pos = m.end()
        return start, pos


class BytesSearch(Protocol):
    def search(self, data: bytes, pos: int = 0) -> re.Match[bytes] | None: ...

    def finditer(self, data: bytes, pos: int = ..., endpos: int = ...) -> Iterator[re.Match[bytes]]: ...


def block_regex(source: str) -> BytesSearch:
    """``source`` over raw bytes, in RE2 where installed (linear in the text), else in Python's engine."""
    pattern = source.encode("utf-8")
    try:
        import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return re.compile(pattern)
    options = re2.Options()
    options.max_mem = 64 << 20  # the DFA of a few hundred anchors with their line-break gaps
    options.log_errors = False
    try:
        return cast(BytesSearch, re2.compile(pattern, options))
    except re2.error:
        return re.compile(pattern)


class Match(Struct, frozen=True):
    signature: Signature
    # The line as it was read (evidence keeps what the operator pasted); two lines when a wrapped record was joined.
    line: str
    # From a record no client controls (``judge.records``): only these may lead to an action.
    trusted: bool = True
    # 1-based number of the line in the scanned input (``judge.scan``); 0 when unknown.
    number: int = 0

    @property
    def code(self) -> str:
        return self.signature.code


class Catalog:
    """The signatures and what searches them; each search structure is built on first use (``diagnose`` of a
    big log needs the block prefilter at once, the per-line one only on the lines it hits)."""

    def __init__(self, signatures: Iterable[Signature]) -> None:
        self.signatures: tuple[Signature, ...] = tuple(signatures)

    @cached_property
    def _forms(self) -> set[str]:
        return {form for sig in self.signatures for p in sig.patterns for form in _anchor_forms(p.pattern)}

    @cached_property
    def prefilter(self) -> re.Pattern[str] | None:
        """The cheap first pass over one line: any pattern's anchor, as a prefix tree."""
        return re.compile(_trie_regex(self._forms)) if self._forms else None

    @cached_property
    def block_prefilter(self) -> BytesSearch:
        """The same over a block of raw bytes (judge.scan): RE2's automaton where installed, linear and several
        times faster than Python's engine over a long text; Python's otherwise."""
        return block_regex(_trie_regex(self._forms, gaps=True) if self._forms else "(?!)")

    @cached_property
    def _line_set(self) -> LineSet | None:
        """The gate and candidates of ``find`` in one RE2 ``Set`` (``judge.line_set``); None without RE2."""
        try:
            import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            return None
        plain: dict[str, set[int]] = {}
        patterns, folded = [], set()
        for n, sig in enumerate(self.signatures):
            for p in sig.patterns:
                text = anchor(p.pattern)
                patterns.append((p.pattern, text, n))
                if p.pattern.startswith("(?i)"):
                    folded.add(n)
                else:
                    plain.setdefault(text, set()).add(n)
        forms = [(f, frozenset(plain.get(f, ()))) for f in sorted(self._forms)]
        try:
            return LineSet(re2, forms, patterns, frozenset(folded))
        except re2.error:
            return None

    @cached_property
    def _searchers(self) -> dict[str, _Searcher]:
        return {p.pattern: _Searcher(p) for sig in self.signatures for p in sig.patterns}

    @cached_property
    def _anchors(self) -> tuple[dict[str, frozenset[int]], tuple[tuple[str, int], ...]]:
        """Where the patterns' anchors lead: for each prefilter form, the signatures (indexes) whose case-sensitive
        patterns are anchored on it or on a form it starts with; and each (?i) pattern's anchor lower-cased with
        its signature ("" where the anchor is not ASCII: always a candidate)."""
        plain: dict[str, set[int]] = {}
        folded = []
        for n, sig in enumerate(self.signatures):
            for p in sig.patterns:
                text = anchor(p.pattern)
                if p.pattern.startswith("(?i)"):
                    folded.append((text.lower() if text.isascii() else "", n))
                else:
                    plain.setdefault(text, set()).add(n)
        by_form = {f: frozenset(n for a, ns in plain.items() if f.startswith(a) for n in ns) for f in self._forms}
        return by_form, tuple(folded)

    def _candidates(self, text: str, first: re.Match[str]) -> list[int]:
        """The signatures (indexes, in order) one of whose patterns' anchors occurs in ``text``: no other can
        match. ``first`` is the prefilter's first hit; it is searched again from each hit's next character, and
        a hit is the longest form at its place, so every place where a form starts is seen, with every shorter
        form there (the ones it starts with). A (?i) anchor is looked for in the lower-cased text, which is exact
        for ASCII text; in other text (Unicode case folding pairs "s" with U+017F) each (?i) pattern is tried."""
        by_form, folded = self._anchors
        hits: set[int] = set()
        prefilter = self.prefilter
        m: re.Match[str] | None = first
        while m is not None and prefilter is not None:
            hits.update(by_form[m.group()])
            m = prefilter.search(text, m.start() + 1)
        if text.isascii():
            lowered = text.lower()
            hits.update(n for literal, n in folded if literal in lowered)
        else:
            hits.update(n for _, n in folded)
        return sorted(hits)

    def by_code(self) -> dict[str, Signature]:
        return {s.code: s for s in self.signatures}

    def may_match(self, text: str) -> bool:
        """False only when ``find`` finds nothing in ``text`` nor in any part of it, whatever it is asked (one pass
        of RE2's automaton: ``judge.scan`` reads no more of a line that cannot match)."""
        line_set = self._line_set
        return bool(self._forms) and (line_set is None or line_set.may_match(text))

    def find(self, text: str, kind: str | None = None, *, start: int = 0, quoted: bool = True) -> list[Signature]:
        """Signatures whose patterns occur in ``text`` from ``start`` on (a cleaned record's message); with
        ``quoted=False`` a match lying wholly inside quotes (a prompt a client sent) does not count."""
        from dgxdoctor.judge.records import inside_quotes

        text = text[:MAX_MATCH_CHARS]
        if not self._forms:
            return []
        body = text[start:]
        line_set = self._line_set
        if line_set is not None:
            hit = line_set.candidates(body)
            if hit is None:
                return []
            candidates = sorted(hit)
        elif self.prefilter is None or (first := self.prefilter.search(text, start)) is None:
            return []
        else:
            candidates = self._candidates(text, first)
        found = []
        for n in candidates:
            sig = self.signatures[n]
            if kind is not None and kind not in sig.kinds:
                continue
            for p in sig.patterns:
                span = self._searchers[p.pattern].span(body)
                if span is not None and (quoted or not inside_quotes(text, span[0] + start, span[1] + start)):
                    found.append(sig)
                    break
        refined = {sig.refines for sig in found if sig.refines}
        return [sig for sig in found if sig.code not in refined]

    def match(self, line: str, kind: str | None = None) -> list[Match]:
        """Signatures one line shows on its own, read as the record it is (``judge.records``): nothing from a
        request or access-log record, nothing from quoted text of a client record."""
        from dgxdoctor.judge.records import Trust, clean, may_hold_colour, shape

        if self.prefilter is None:
            return []
        if "\r" not in line and not may_hold_colour(line) and self.prefilter.search(line) is None:
            return []  # cleaning only cuts a prefix off this line: no anchor in it, none in what is left
        text = clean(line)
        found = shape(text)
        if found.trust is Trust.DENIED:
            return []
        client = found.trust is Trust.CLIENT
        trusted = not client
        return [Match(sig, line, trusted) for sig in self.find(text, kind, start=found.message, quoted=not client)]


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
    if pattern.flags & ~(re.UNICODE | re.IGNORECASE) or raw.find("(?i)") > 0:
        raise CatalogError(f"{where}: pattern {raw!r} may use no inline flag but a leading (?i)")
    if _top_level_alternation(raw):
        # The anchor of one branch is not in a line the other matches: the prefilters would drop that line.
        raise CatalogError(f"{where}: pattern {raw!r} has a top-level |: put the alternatives in a group (?:...|...)")
    if len(anchor(raw)) < MIN_ANCHOR:
        # The prefilter looks for this literal text; without it every line would need the regex.
        raise CatalogError(f"{where}: pattern {raw!r} needs {MIN_ANCHOR}+ literal characters outside groups")
    if anchor(raw) in LINE_MARKERS:
        # Every line of its kind holds the marker: every one of them would be read line by line.
        raise CatalogError(
            f"{where}: pattern {raw!r} is anchored on {anchor(raw)!r}, which every such NCCL line carries: "
            f"give it {MIN_ANCHOR}+ literal characters of its own outside groups"
        )
    return pattern


CATALOG_SOURCE = "dgxdoctor/data/signatures.toml"


def _catalog_data() -> dict[str, Any]:
    text = resources.files("dgxdoctor").joinpath("data/signatures.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


@cache
def load_catalog() -> Catalog:
    """The catalog shipped with the package (parsed and compiled once per process)."""
    return parse_catalog(_catalog_data(), CATALOG_SOURCE)


def signature_codes() -> tuple[str, ...]:
    """Every code of the shipped catalog, sorted: the values ``dgxdoctor_logs_signature_matches_total{code}`` can
    take. Read from the data without compiling a pattern (the compiled catalog costs ~4.9 MiB resident, and a
    node whose logs check never sees a log line never compiles it); ``load_catalog`` validates the same data."""
    entries = _catalog_data().get("signature")
    codes = {e.get("code") for e in entries if isinstance(e, dict)} if isinstance(entries, list) else set()
    return tuple(sorted(c for c in codes if isinstance(c, str)))

"""Which signatures a line can show, in one pass of one automaton over it (RE2's ``Set``), whatever the catalog's size.

``Catalog.find`` reads a line the block prefilter hit (``judge.scan``). Before, it searched the line again with
the prefix tree of anchors from each place an anchor started, then tried every case-insensitive pattern's anchor in
the lower-cased line: the cost of a line grew with the number of signatures that shared a word with it. Here one
``re2.Set`` holds, for every pattern, a form of the whole pattern that RE2 can run (``relaxed``), and every
prefilter form of an anchor: one ``Match`` of the line says which prefilter forms it holds (``find`` reads no line
without one, as before) and which patterns can match it, and only those run in Python's engine, which decides.

A relaxed form matches wherever its pattern matches in ASCII text (it may match more, never less): the zero-width
assertions (lookarounds, ``\\b``, ``^``, ``$``) are left out and ``\\s`` is spelt as Python's set. In text that is
not ASCII (Python's ``\\w``, ``\\d`` and case folding there are Unicode's) the line's candidates are the
signatures whose case-sensitive anchor it holds and every case-insensitive one, as before. A pattern RE2 cannot
run stands for itself by its anchor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dgxdoctor.relaxed_re import relaxed

__all__ = ["LineSet", "relaxed"]


class LineSet:
    """One RE2 ``Set`` of the prefilter forms (the gate) and of every pattern (the candidates). ``forms``: the
    prefilter's literal forms, each with the signatures (indexes) whose case-sensitive anchor it is; ``patterns``:
    each pattern's source with its signature; ``anchors``: each pattern's anchor (what stands for a pattern RE2
    cannot run); ``folded``: the signatures with a case-insensitive pattern."""

    def __init__(
        self,
        re2: Any,
        forms: Sequence[tuple[str, frozenset[int]]],
        patterns: Sequence[tuple[str, str, int]],
        folded: frozenset[int],
    ) -> None:
        options = re2.Options()
        options.max_mem = 64 << 20
        options.log_errors = False
        self._set = re2.Set.SearchSet(options)
        self._form_sigs: list[frozenset[int]] = []
        for form, sigs in forms:
            self._set.Add(re2.escape(form))
            self._form_sigs.append(sigs)
        self._pattern_sigs: list[int] = []
        # Python folds a few letters outside ASCII onto ASCII ones (U+017F onto "s"): a pattern that is not ASCII
        # is tried on every line that passes the gate.
        self._always = frozenset(sig for source, _, sig in patterns if not source.isascii())
        for source, anchor_text, sig in patterns:
            whole = relaxed(source)
            try:
                self._set.Add(whole) if whole is not None else self._anchor(re2, source, anchor_text)
            except re2.error:
                self._anchor(re2, source, anchor_text)
            self._pattern_sigs.append(sig)
        self._set.Compile()
        self._forms = len(self._form_sigs)
        self._folded = folded

    def _anchor(self, re2: Any, source: str, anchor_text: str) -> None:
        literal = re2.escape(anchor_text)
        self._set.Add(f"(?i:{literal})" if source.startswith("(?i)") else literal)

    def may_match(self, text: str) -> bool:
        """False when no pattern can match anywhere in ``text`` (whatever part of it ``find`` reads): in ASCII
        text no relaxed form matches; in other text no prefilter form occurs."""
        ids = self._set.Match(text)
        if not ids:
            return False
        forms = self._forms
        if text.isascii():
            return any(n >= forms for n in ids)
        return any(n < forms for n in ids)

    def candidates(self, body: str) -> set[int] | None:
        """The signatures (indexes) that can match ``body``; None when it holds no prefilter form (no signature)."""
        ids = self._set.Match(body)
        if not ids:
            return None
        forms = self._forms
        ascii_ = body.isascii()
        gate = False
        out: set[int] = set()
        for n in ids:
            if n < forms:
                gate = True
                if not ascii_:
                    out.update(self._form_sigs[n])
            elif ascii_:
                out.add(self._pattern_sigs[n - forms])
        if not gate:
            return None
        out.update(self._always if ascii_ else self._folded)
        return out

"""A regular expression compiled at its first use, not when its module is imported.

The readers hold a few hundred patterns; compiling them all at import cost tens of milliseconds of every start of
`dgxdoctor check` and `diagnose`, most for sources and formats that run does not read (benchmarks/README.md).
``lazy_compile`` takes ``re.compile``'s place at module level and answers the same methods. Two threads racing to
the first use compile it twice, harmlessly.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any


class LazyPattern:
    """``re.compile(source, flags)`` on the first match, search or substitution."""

    __slots__ = ("_compiled", "_flags", "_source")

    def __init__(self, source: str, flags: int = 0) -> None:
        self._source = source
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self._source, self._flags)
        return compiled

    @property
    def pattern(self) -> str:
        return self._source

    @property
    def source_flags(self) -> int:
        """The flags given, without compiling (``flags`` is the compiled pattern's, with ``re.UNICODE``)."""
        return self._flags

    @property
    def flags(self) -> int:
        return self.compiled.flags

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self.compiled.groupindex)

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.match(string, pos, endpos)

    def fullmatch(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.fullmatch(string, pos, endpos)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.search(string, pos, endpos)

    def finditer(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        return self.compiled.findall(string, pos, endpos)

    def split(self, string: str, maxsplit: int = 0) -> list[str | Any]:
        return self.compiled.split(string, maxsplit)

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return self.compiled.sub(repl, string, count)

    def subn(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> tuple[str, int]:
        return self.compiled.subn(repl, string, count)


def lazy_compile(source: str, flags: int = 0) -> LazyPattern:
    """``re.compile`` for a module-level pattern, deferred to its first use."""
    return LazyPattern(source, flags)


def module_patterns(*packages: ModuleType) -> list[tuple[str, re.Pattern[str]]]:
    """Every compiled pattern (lazy ones compiled now) at module level in the modules of ``packages``, named
    ``module.NAME``: what the regex-cost benchmark and the backtracking-shape test walk."""
    import importlib  # a test's and a benchmark's walk: kept off the import path of every start
    import pkgutil

    found = []
    for package in packages:
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name, value in vars(module).items():
                if isinstance(value, LazyPattern):
                    value = value.compiled
                if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                    found.append((f"{module.__name__}.{name}", value))
    return found

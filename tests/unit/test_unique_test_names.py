"""pytest imports test files by basename (no packages under tests/): two files of one name break collection."""

from __future__ import annotations

from collections import Counter

from conftest import REPO


def test_every_test_file_name_is_unique() -> None:
    names = Counter(p.name for p in (REPO / "tests").rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []

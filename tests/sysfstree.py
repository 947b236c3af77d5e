"""Lay a sysfs capture back out as files, for checks that read an injected sysfs root."""

from __future__ import annotations

from pathlib import Path

SYSFS_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sysfs_ib"


def build_sysfs_tree(root: Path, fixture: str) -> Path:
    """Write a ``grep -r .`` capture (``path:content`` lines, see tests/fixtures/sysfs_ib/SOURCES.md) under ``root``."""
    for line in (SYSFS_FIXTURES / fixture).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        rel, _, value = line.partition(":")
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if value == "<unreadable>":
            path.mkdir()  # reading a directory fails with an OSError, like EIO from the driver
        else:
            path.write_text(value + "\n")
    return root

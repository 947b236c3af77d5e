"""Every registered check has its page in docs/checks/, named after the check, and every page there is a check's."""

from __future__ import annotations

from pathlib import Path

from dgxdoctor.checks.registry import ALL_CHECKS

PAGES = Path(__file__).resolve().parents[2] / "docs" / "checks"


def registered() -> set[str]:
    return {factory.name for factory in ALL_CHECKS}


def test_every_registered_check_has_a_page() -> None:
    missing = sorted(name for name in registered() if not (PAGES / f"{name}.md").is_file())
    assert missing == [], "write docs/checks/<name>.md for each"


def test_every_page_is_a_registered_check() -> None:
    orphans = sorted(p.stem for p in PAGES.glob("*.md") if p.stem not in registered())
    assert orphans == []


def test_each_page_names_its_check_in_its_title() -> None:
    """The first line is the page's title and says which check it is (`name` as in the config and the metrics)."""
    wrong = sorted(
        name
        for name in registered()
        if (PAGES / f"{name}.md").is_file()
        and f"`{name}`" not in (PAGES / f"{name}.md").read_text(encoding="utf-8").splitlines()[0]
    )
    assert wrong == []

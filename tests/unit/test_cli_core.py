"""The CLI as an operator meets it: config errors, selection errors, the example config."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, run_cli


def test_invalid_config_exits_78_and_names_every_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text('nodee = "x"\n[paths]\nsysfs_root = 5\nbogus = true\n[checks.gpu]\nexpected_count = "8"\n')
    done = run_cli("check", "--config", str(bad))
    assert done.returncode == 78
    for problem in (
        "nodee: unknown table",
        "paths: expected a path (string), got int - at `$.paths.sysfs_root`",  # a table's first problem
        "checks.gpu: Expected `int`, got `str` - at `$.checks.gpu.expected_count`",
    ):
        assert problem in done.stderr
    assert str(bad) in done.stderr


def test_toml_syntax_error_exits_78(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text("[paths\n")
    done = run_cli("check", "--config", str(bad))
    assert done.returncode == 78
    assert "syntax" in done.stderr


def test_missing_explicit_config_exits_78(tmp_path: Path) -> None:
    done = run_cli("check", "--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 78
    assert "no such file" in done.stderr


def test_unknown_check_name_is_a_usage_error() -> None:
    done = run_cli("check", "--only", "no_such_check")
    assert done.returncode == 64
    assert "no_such_check" in done.stderr


def test_shipped_example_config_is_current() -> None:
    """docs/config.example.toml is generated; regenerate with `dgxdoctor config-example`."""
    done = run_cli("config-example")
    assert done.returncode == 0
    shipped = (REPO / "docs" / "config.example.toml").read_text()
    assert shipped == done.stdout, "run: dgxdoctor config-example > docs/config.example.toml"


def test_example_config_is_accepted(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(run_cli("config-example").stdout)
    done = run_cli("check", "--config", str(cfg), "--skip", "", "--json")
    assert done.returncode in (0, 1, 2, 3), done.stderr

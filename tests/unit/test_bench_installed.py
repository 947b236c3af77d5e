"""benchmarks/installed.py: which interpreter the benchmarks measure (the README's install, or --python)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from conftest import REPO, load_benchmark

installed = load_benchmark("installed", "bench_installed")


def test_the_installed_product_runs_its_console_script_without_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    product = installed.Product(Path("/opt/dgxdoctor/bin/python"), installed=True)
    assert product.command("check") == ["/opt/dgxdoctor/bin/dgxdoctor", "check"]
    assert product.command("check", flags=["-X", "importtime"]) == [
        "/opt/dgxdoctor/bin/python", "-X", "importtime", "/opt/dgxdoctor/bin/dgxdoctor", "check",
    ]  # fmt: skip
    env = product.env()
    assert "PYTHONPATH" not in env and "PYTHONDONTWRITEBYTECODE" not in env


def test_another_interpreter_runs_the_checkouts_src_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    product = installed.resolve(sys.executable)
    assert not product.installed
    assert product.command("run") == [sys.executable, "-m", "dgxdoctor", "run"]
    assert product.env()["PYTHONPATH"] == f"{REPO / 'src'}:/tmp/site"


def test_without_an_index_and_a_cached_install_the_running_interpreter_is_measured_and_says_why(
    tmp_path: Path,
) -> None:
    product = installed.resolve("installed", reachable=lambda: "no network", venv=tmp_path / "venv")
    assert product.python == Path(sys.executable) and not product.installed
    assert "no network" in product.why
    assert not (tmp_path / "venv").exists()  # nothing was built


def test_an_install_from_other_sources_is_not_fresh(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dgxdoctor").write_text("")
    (tmp_path / "installed-from").write_text("0" * 64 + "\n")
    assert not installed._fresh(tmp_path)
    (tmp_path / "installed-from").write_text(installed.src_digest() + "\n")
    assert installed._fresh(tmp_path)
    product = installed.resolve("installed", reachable=lambda: pytest.fail("no index asked"), venv=tmp_path)
    assert product.installed and product.python == tmp_path / "bin" / "python"


def test_index_reachability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert installed.index_unreachable() == "PIP_NO_INDEX is set"
    monkeypatch.delenv("PIP_NO_INDEX")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: a connect is refused
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
        assert "does not answer" in (installed.index_unreachable(timeout=1) or "")
        s.listen()
        assert installed.index_unreachable(timeout=1) is None


def test_pips_configured_index_is_read_from_pip_config_list() -> None:
    # `pip config list` output, one line per setting
    listed = "global.cert='/etc/ssl/certs/ca.crt'\nglobal.index-url='https://mirror.example/simple'\n"
    found = installed.INDEX_URL_RE.search(listed)
    assert found is not None and found["url"] == "https://mirror.example/simple"

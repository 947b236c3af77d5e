"""The CLI on bad input: garbage, empty, missing and directory inputs to ``diagnose``; broken configs (exit 78,
every bad key named); shell metacharacters in names (usage error 64, nothing executed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_cli, run_clis

EX_USAGE = 64
EX_CONFIG = 78


def test_diagnose_binary_garbage(tmp_path: Path) -> None:
    garbage = tmp_path / "core.bin"
    garbage.write_bytes(bytes(range(256)) * 64 + b"\0\xff\xfe" * 1000)
    done = run_cli("diagnose", "--json", str(garbage))
    assert done.returncode == 3, done.stderr  # UNKNOWN: nothing recognised
    doc = json.loads(done.stdout)
    assert doc["inputs"][0]["kind"] == "unknown"
    assert doc["inputs"][0]["findings"][0]["code"] == "UNRECOGNIZED_INPUT"
    assert "Traceback" not in done.stderr


def test_diagnose_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    done = run_cli("diagnose", str(empty))
    assert done.returncode == 3 and "EMPTY_INPUT" in done.stdout  # said as empty, not as an unknown kind
    assert "Traceback" not in done.stderr


def test_diagnose_garbage_forced_to_every_kind(tmp_path: Path) -> None:
    garbage = tmp_path / "g.txt"
    garbage.write_bytes(b"\0\0\xffGPU0\tX\nCA '\nPort 1:\n" + b"A" * 100_000 + b"\n=== Autoscaler status: x ===\n")
    from dgxdoctor.diagnose.registry import ANALYZERS

    runs = run_clis([("diagnose", "--kind", analyzer.kind, "--json", str(garbage)) for analyzer in ANALYZERS])
    for analyzer, done in zip(ANALYZERS, runs, strict=True):
        assert done.returncode in (0, 1, 2, 3), (analyzer.kind, done.stderr)
        assert "Traceback" not in done.stderr, (analyzer.kind, done.stderr)
        assert json.loads(done.stdout)["inputs"][0]["kind"]


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda d: d / "no-such-file.txt", "cannot read"),
        (lambda d: d, "is a directory"),
    ],
)
def test_diagnose_missing_file_or_directory_is_a_usage_error(tmp_path: Path, make: object, expect: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    done = run_cli("diagnose", str(target))
    assert done.returncode == EX_USAGE, done.stderr
    assert expect in done.stderr and str(target) in done.stderr
    assert "Traceback" not in done.stderr


def test_config_malformed_toml(tmp_path: Path) -> None:
    texts = ("[daemon\n", "x = [\n", "a = 1\na = 2\n", "\xff\xfe", 'k = "unterminated\n')
    configs = [tmp_path / f"config-{i}.toml" for i in range(len(texts))]
    for text, bad in zip(texts, configs, strict=True):
        bad.write_bytes(text.encode("latin-1"))
    for text, bad, done in zip(texts, configs, run_clis([("check", "--config", str(c)) for c in configs]), strict=True):
        assert done.returncode == EX_CONFIG, (text, done.stderr)
        assert str(bad) in done.stderr and "Traceback" not in done.stderr


def test_config_nested_too_deeply_exits_78(tmp_path: Path) -> None:
    # Found by the property tests: tomllib recurses per nesting level; RecursionError escaped as a traceback.
    bad = tmp_path / "config.toml"
    bad.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    done = run_cli("check", "--config", str(bad))
    assert done.returncode == EX_CONFIG, done.stderr
    assert "nested too deeply" in done.stderr and "Traceback" not in done.stderr


def test_config_wrong_types_at_every_depth_all_named(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text(
        "node = 7\n"
        "[paths]\nsysfs_root = 3\nsurprise = 1\n"
        '[daemon]\nlisten = 5\npeers = "http://dgx-b:9835"\nhistory = "many"\n'
        '[checks.gpu]\nenabled = "maybe"\n'
        "[checks.bogus_check]\nenabled = true\n"
    )
    done = run_cli("check", "--config", str(bad))
    assert done.returncode == EX_CONFIG, done.stderr
    for line in (  # every table's problem at once, the first of each table, with its key path
        "  node: Expected `object`, got `int` - at `$.node`",
        "  paths: expected a path (string), got int - at `$.paths.sysfs_root`",
        "  daemon: Expected `str`, got `int` - at `$.daemon.listen`",
        "  checks.gpu: Expected `bool`, got `str` - at `$.checks.gpu.enabled`",
        "  checks.bogus_check: unknown check",
    ):
        assert line in done.stderr, (line, done.stderr)
    assert "Traceback" not in done.stderr


def test_config_is_a_directory(tmp_path: Path) -> None:
    done = run_cli("check", "--config", str(tmp_path))
    assert done.returncode == EX_USAGE and "is a directory" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "names",
    [
        "gpu;touch {s}",
        "gpu && touch {s}",
        "$(touch {s})",
        "`touch {s}`",
        "gpu|touch {s}",
        "gpu\ntouch {s}",
    ],
)
def test_only_with_shell_metacharacters_is_a_usage_error_and_runs_nothing(tmp_path: Path, names: str) -> None:
    sentinel = tmp_path / "executed"
    value = names.format(s=sentinel)
    for done in run_clis([("check", "--only", value), ("check", "--skip", value)]):
        assert done.returncode == EX_USAGE, done.stderr
        assert "unknown check" in done.stderr
        assert not sentinel.exists(), "a name reached a shell"


def test_diagnose_file_names_are_never_a_shell(tmp_path: Path) -> None:
    sentinel = tmp_path / "executed"
    name = f"$(touch {sentinel});touch {sentinel}"
    done = run_cli("diagnose", name)
    assert done.returncode == EX_USAGE and not sentinel.exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("listen", ["0.0.0.0:$(touch {s})", "0.0.0.0:\u00b2", "0.0.0.0:" + "9" * 5000, ";touch {s}"])
def test_run_with_a_bad_listen_address_is_a_usage_error(tmp_path: Path, listen: str) -> None:
    sentinel = tmp_path / "executed"
    config = tmp_path / "config.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    done = run_cli("run", "--config", str(config), "--listen", listen.format(s=sentinel))
    assert done.returncode == EX_USAGE, done.stderr
    assert "--listen" in done.stderr and "Traceback" not in done.stderr
    assert not sentinel.exists()


def test_diagnose_of_a_fifo_or_a_device_is_a_clear_error_never_a_hang(tmp_path: Path) -> None:
    """``open()`` of a FIFO waits for a writer forever; diagnose names what the file is and points at stdin."""
    fifo = tmp_path / "paste"
    os.mkfifo(fifo)
    done = run_cli("diagnose", str(fifo), timeout=30)
    assert done.returncode == 64 and "a FIFO, not a regular file" in done.stderr, done.stderr
    done = run_cli("diagnose", "/dev/zero", timeout=30)
    assert done.returncode == 64 and "a character device" in done.stderr, done.stderr

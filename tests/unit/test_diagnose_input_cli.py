"""`diagnose` says what it read: a status per input and overall in --json, empty and compressed inputs named."""

from __future__ import annotations

import gzip
from pathlib import Path

from conftest import FIXTURES, run_cli


def test_json_has_a_status_per_input_and_overall() -> None:
    down = FIXTURES / "ib" / "ibstat_cx6_hdr_down.txt"
    done = run_cli("diagnose", "--json", str(down))
    doc = done.json()
    assert doc["status"] == "critical"
    assert doc["exit_code"] == done.returncode == 2
    assert [i["status"] for i in doc["inputs"]] == ["critical"]


def test_empty_input_is_unknown_not_an_unknown_kind(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    done = run_cli("diagnose", "--json", str(empty))
    doc = done.json()
    assert done.returncode == 3
    assert doc["inputs"][0]["kind"] == "empty"
    assert doc["inputs"][0]["findings"][0]["code"] == "EMPTY_INPUT"
    assert run_cli("diagnose", "-", stdin="").returncode == 3


def test_gzip_input_says_how_to_read_it(tmp_path: Path) -> None:
    packed = tmp_path / "dmesg.txt.gz"
    packed.write_bytes(gzip.compress(b"NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"))
    done = run_cli("diagnose", str(packed))
    assert done.returncode == 64
    assert f"zcat {packed} | dgxdoctor diagnose -" in done.stderr
    assert "none of the known kinds" not in done.stderr + done.stdout

"""The journal side of the logs check that needs no journal: its default units are the shipped units, and the
bounded runner it reads journalctl through stops a program that prints more than the limit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dgxdoctor.checks.logs import SHIPPED_UNITS, LogsSettings
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.sources.commands import run_command_head
from dgxdoctor.sources.journal import journal_argv, parse_entry

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
AGENT_UNIT = "dgxdoctor.service"


def test_the_default_units_are_those_of_systemd_dir() -> None:
    """Every shipped unit that runs vLLM or Ray logs to the journal (none sets StandardOutput=): all followed."""
    shipped = {p.name for p in SYSTEMD.glob("*.service")} - {AGENT_UNIT}
    assert set(SHIPPED_UNITS) == shipped
    assert LogsSettings().journal_units == list(SHIPPED_UNITS)
    for name in shipped:
        assert "StandardOutput=" not in (SYSTEMD / name).read_text()


def test_a_unit_name_that_is_not_one_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="journal_units"):
        parse_config({"checks": {"logs": {"journal_units": ["vllm.service; rm -rf /"]}}})


def test_every_value_is_one_argv_element() -> None:
    argv = journal_argv(["-vllm.service"], directory="-x dir", after_cursor="s=1;i=2", lines=5)
    assert argv[-4:] == ["--directory=-x dir", "--unit=-vllm.service", "--after-cursor=s=1;i=2", "--lines=5"]
    with pytest.raises(ValueError):
        journal_argv(["vllm.service"], after_cursor="s=1 --since=x")


def test_a_message_that_is_not_utf8_is_read_from_its_bytes() -> None:
    line = '{"__CURSOR":"s=1;i=2","__REALTIME_TIMESTAMP":"5","_SYSTEMD_UNIT":"vllm.service","MESSAGE":[104,105,255]}'
    entry = parse_entry(line, ["vllm.service"])
    assert entry is not None and entry.message == "hi\ufffd" and entry.unit == "vllm.service"
    assert parse_entry('{"MESSAGE":"no cursor"}', ["vllm.service"]) is None


def test_the_head_runner_stops_a_program_past_its_limit() -> None:
    t0 = time.monotonic()
    done = run_command_head(["yes"], 10.0, 1000)
    assert done.cut and len(done.stdout) == 1000 and done.stdout.startswith("y\ny\n")
    assert time.monotonic() - t0 < 5
    whole = run_command_head(["echo", "short"], 10.0, 1000)
    assert not whole.cut and whole.stdout == "short\n" and whole.returncode == 0

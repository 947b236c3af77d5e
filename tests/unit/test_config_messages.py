"""Config errors an operator can act on: no doubled value, arrays named as arrays, a did-you-mean for typos;
and the generated example spells out every choice on lines a terminal can show."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dgxdoctor.commands.config_doc import example_config
from dgxdoctor.compat import tomllib
from dgxdoctor.config import ConfigError, parse_config


def problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    return dict(err.value.problems)


def test_value_error_names_the_value_once() -> None:
    assert problems({"daemon": {"listen": "localhost"}}) == {"daemon.listen": "expected HOST:PORT, got 'localhost'"}


def test_a_string_where_an_array_is_expected() -> None:
    found = problems({"daemon": {"peers": "http://dgx-b:9835"}})
    assert found == {"daemon.peers": "expected a TOML array, e.g. [\"http://dgx-b:9835\"], got str 'http://dgx-b:9835'"}


def test_a_toml_array_is_accepted_where_a_tuple_is_kept() -> None:
    config = parse_config(tomllib.loads('[daemon]\npeers = ["http://dgx-b:9835"]\n'))
    assert config.daemon.peers == ("http://dgx-b:9835",)


def test_an_array_too_long_is_said_so_not_called_a_wrong_type() -> None:
    peers = [f"http://10.0.0.{i}:9835" for i in range(65)]
    found = problems(tomllib.loads(f"[daemon]\npeers = {json.dumps(peers)}\n"))
    assert found == {"daemon.peers": "at most 64 entries, got 65"}  # was: "expected a TOML array, got list [...]"


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        ({"daemon": {"lisen": "x"}}, "daemon.lisen", "unknown key (did you mean 'listen'?)"),
        ({"checks": {"vlm": {}}}, "checks.vlm", "unknown key (did you mean 'vllm'?)"),
        (
            {"checks": {"gpu": {"expected_cout": 8}}},
            "checks.gpu.expected_cout",
            "unknown key (did you mean 'expected_count'?)",
        ),
        (
            {"checks": {"infiniband": {"thresholds": {"link_downed": {"limt": 1}}}}},
            "checks.infiniband.thresholds.link_downed.limt",
            "unknown key (did you mean 'limit'?)",
        ),
        ({"daemon": {"zzzz": 1}}, "daemon.zzzz", "unknown key"),
    ],
)
def test_did_you_mean(data: dict[str, Any], key: str, reason: str) -> None:
    assert problems(data) == {key: reason}


def test_example_lists_literal_choices_and_has_no_runaway_line() -> None:
    text = example_config()
    assert '# type: "head" | "worker" | None' in text
    assert '# type: "always" | "never" | "oneshot"' in text
    assert "Literal" not in text and "Optional" not in text
    assert max(len(line) for line in text.splitlines()) < 160
    parsed = tomllib.loads(text)
    assert parsed["node"]["role"] == "head"
    assert parsed["checks"]["infiniband"]["thresholds"]["symbol_error_ber"]["limit"] == 120.0

"""Config errors an operator can act on: msgspec's message with the key path, a did-you-mean for a table's typos;
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
    assert problems({"daemon": {"listen": "localhost"}}) == {
        "daemon": "listen: expected HOST:PORT, got 'localhost' - at `$.daemon`"
    }


def test_a_string_where_an_array_is_expected() -> None:
    found = problems({"daemon": {"peers": "http://dgx-b:9835"}})
    assert found == {"daemon": "Expected `array`, got `str` - at `$.daemon.peers`"}


def test_a_toml_array_is_accepted_where_a_tuple_is_kept() -> None:
    config = parse_config(tomllib.loads('[daemon]\npeers = ["http://dgx-b:9835"]\n'))
    assert config.daemon.peers == ("http://dgx-b:9835",)


def test_an_array_too_long_is_said_so_not_called_a_wrong_type() -> None:
    peers = [f"http://10.0.0.{i}:9835" for i in range(65)]
    found = problems(tomllib.loads(f"[daemon]\npeers = {json.dumps(peers)}\n"))
    assert found == {"daemon": "Expected `array` of length <= 64 - at `$.daemon.peers`"}


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        (
            {"daemon": {"lisen": "x"}},
            "daemon",
            "Object contains unknown field `lisen` - at `$.daemon` ('lisen': did you mean 'listen'?)",
        ),
        ({"checks": {"vlm": {}}}, "checks.vlm", "unknown check (did you mean 'vllm'?)"),
        ({"nod": {}}, "nod", "unknown table (did you mean 'node'?)"),
        (
            {"checks": {"gpu": {"expected_cout": 8}}},
            "checks.gpu",
            "Object contains unknown field `expected_cout` - at `$.checks.gpu` ('expected_cout': did you mean "
            "'expected_count'?)",
        ),
        (
            {"checks": {"infiniband": {"thresholds": {"link_downed": {"limt": 1}}}}},
            "checks.infiniband",
            "Object contains unknown field `limt` - at `$.checks.infiniband.thresholds[...]`",
        ),
        ({"daemon": {"zzzz": 1}}, "daemon", "Object contains unknown field `zzzz` - at `$.daemon`"),
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

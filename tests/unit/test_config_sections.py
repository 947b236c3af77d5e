"""The config is validated table by table: a table the config does not name is its default, never validated.
These tests hold the defaults equal to the validated ones (so a rule that changes a default is never skipped
silently) and the parse equal to one root model's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
from msgspec import Struct
from msgspec.structs import fields

from dgxdoctor.compat import tomllib
from dgxdoctor.config import ConfigError, _one_role, config_model, parse_config
from dgxdoctor.settings.base import Frozen
from dgxdoctor.validation import HttpUrl, dump, validate

REPO = Path(__file__).resolve().parents[2]


def _models_in(annotation: Any) -> list[type[Struct]]:
    """The tables an annotation holds: itself, or inside ``X | None``, ``dict[str, X]``, ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, Struct):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _reachable() -> list[type[Struct]]:
    """Every settings table a config reaches: the sections, every registered check's settings_model, and the tables
    nested in them (RemediationCommands, the infiniband rules)."""
    seen: list[type[Struct]] = []
    todo: list[type[Struct]] = [config_model()]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        todo += [inner for field in fields(model) for inner in _models_in(field.type)]
    return seen


def _default_differs(model: type[Struct]) -> str | None:
    """Why ``model()`` is not its own dump validated, or None when they are the same."""
    built = model()
    validated = validate(model, dump(built))
    if dump(built) != dump(validated) or built != validated:
        return f"{dump(built)} != {dump(validated)}"
    return None


def test_every_settings_model_is_reached() -> None:
    names = {model.__name__ for model in _reachable()}
    expected = {"NodeSettings", "DaemonSettings", "RemediationCommands", "CounterThreshold", "VllmSettings"}
    assert expected <= names
    assert len(names) >= 25  # the sections, every check's table, the nested ones


@pytest.mark.parametrize("model", _reachable(), ids=lambda m: m.__name__)
def test_constructed_default_is_the_validated_default(model: type[Struct]) -> None:
    """A table a config does not name is ``model()``, whose defaults msgspec does not decode: each must be what
    decoding it would give (a URL without its trailing slash, a size in its spelling, within its bounds)."""
    assert _default_differs(model) is None


def test_a_default_a_validator_changes_is_caught() -> None:
    """The test above is sound: a default that validation would change does not pass as constructed."""

    class Slashed(Frozen, frozen=True):
        url: HttpUrl = HttpUrl("http://dgx-a:8000/")  # a decoded URL has no trailing slash

    assert _default_differs(Slashed) is not None


def test_the_built_in_infiniband_rules_are_the_validated_rules() -> None:
    from dgxdoctor.judge.infiniband import DEFAULT_THRESHOLDS, CounterThreshold

    for threshold in DEFAULT_THRESHOLDS.values():
        validated = validate(CounterThreshold, dump(threshold))
        assert dump(validated) == dump(threshold)
        assert validated == threshold


def _as_one_root_model(data: dict[str, Any]) -> Struct:
    """What the config was before it was validated table by table: one root model over everything."""
    return validate(config_model(), _one_role(data, "x"))


@pytest.mark.parametrize("source", ["defaults", "example", "some tables"])
def test_the_parse_equals_one_root_models(source: str) -> None:
    example = tomllib.loads((REPO / "docs" / "config.example.toml").read_text(encoding="utf-8"))
    data = {
        "defaults": {},
        "example": example,
        "some tables": {"node": {"role": "worker"}, "remediation": {}, "checks": {"vllm": {"interval_s": 5}}},
    }[source]
    parsed, root = parse_config(data).model, _as_one_root_model(data)
    assert parsed == root
    assert dump(parsed) == dump(root)


def test_every_problem_of_every_table_at_once() -> None:
    """A problem of every table (msgspec stops at a table's first): the tables in order (checks in the registry's),
    then unknown names; each message with its full key path."""
    data = {
        "daemon": {"listen": "nowhere", "peer_timeout_s": 0, "token": "hunter2"},
        "checks": {"vllm": {"base_url": "127.0.0.1:8000"}, "gpuu": {}, "infiniband": {"thresholds": {"x": []}}},
        "bundel": {},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    paths = [path for path, _ in err.value.problems]
    assert paths == ["daemon", "checks.infiniband", "checks.vllm", "checks.gpuu", "bundel"]
    reasons = dict(err.value.problems)
    assert "hunter2" not in str(err.value)
    assert reasons["daemon"] == "Expected `float` > 0.0 - at `$.daemon.peer_timeout_s`"  # the first, as written
    assert reasons["checks.infiniband"] == "Expected `object`, got `array` - at `$.checks.infiniband.thresholds[...]`"
    assert "is not an http(s)://HOST:PORT[/PATH] URL - at `$.checks.vllm.base_url`" in reasons["checks.vllm"]
    assert reasons["checks.gpuu"] == "unknown check (did you mean 'gpu'?)"
    assert reasons["bundel"] == "unknown table (did you mean 'bundle'?)"


def test_a_check_table_that_is_not_a_table() -> None:
    for data, path in (({"checks": 5}, "checks"), ({"checks": {"vllm": 5}}, "checks.vllm"), ({"daemon": 5}, "daemon")):
        with pytest.raises(ConfigError) as err:
            parse_config(data)
        [(where, reason)] = err.value.problems
        assert where == path and ("Expected `object`, got `int`" in reason or "got int" in reason), reason

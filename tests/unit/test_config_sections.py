"""The config is validated table by table: a table the config does not name is its constructed default, never
validated, and builds no schema. These tests hold the constructed defaults equal to the validated ones (so a
validator that changes a default is never skipped silently) and the parse equal to one root model's."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, Field, field_validator

from conftest import fresh_python
from dgxdoctor.config import ConfigError, _one_role, config_model, parse_config

REPO = Path(__file__).resolve().parents[2]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, or inside ``X | None``, ``dict[str, X]``, ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _reachable() -> list[type[BaseModel]]:
    """Every settings model a config reaches: the sections, every registered check's settings_model, and the tables
    nested in them (RemediationCommands, the infiniband rules)."""
    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [config_model()]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        todo += [inner for field in model.model_fields.values() for inner in _models_in(field.annotation)]
    return seen


def _default_differs(model: type[BaseModel]) -> str | None:
    """Why ``model.model_construct()`` is not ``model.model_validate({})``, or None when they are the same."""
    built, validated = model.model_construct(), model.model_validate({})
    if built.model_fields_set != validated.model_fields_set:
        return f"fields_set {built.model_fields_set} != {validated.model_fields_set}"
    if built.model_dump() != validated.model_dump() or built != validated:
        return f"{built.model_dump()} != {validated.model_dump()}"
    return None


def test_every_settings_model_is_reached() -> None:
    names = {model.__name__ for model in _reachable()}
    expected = {"NodeSettings", "DaemonSettings", "RemediationCommands", "CounterThreshold", "VllmSettings"}
    assert expected <= names
    assert len(names) >= 25  # the sections, every check's table, the nested ones


@pytest.mark.parametrize("model", _reachable(), ids=lambda m: m.__name__)
def test_constructed_default_is_the_validated_default(model: type[BaseModel]) -> None:
    """A table a config does not name is ``model_construct()`` (no validation, no schema): only sound while no
    validator changes a default (``validate_default``, a model validator that fills a field)."""
    assert _default_differs(model) is None


def test_a_default_a_validator_changes_is_caught() -> None:
    """The test above is sound: a default that validation would change does not pass as constructed."""

    class Widened(BaseModel):
        hosts: tuple[str, ...] = Field(("dgx-a",), validate_default=True)

        @field_validator("hosts")
        @classmethod
        def _lower(cls, value: tuple[str, ...]) -> tuple[str, ...]:
            return (*value, "dgx-b")

    assert _default_differs(Widened) is not None


def test_the_built_in_infiniband_rules_are_the_validated_rules() -> None:
    from dgxdoctor.judge.infiniband import DEFAULT_THRESHOLDS, CounterThreshold

    for rule in DEFAULT_THRESHOLDS.values():
        validated = CounterThreshold.model_validate(rule.model_dump(include=rule.model_fields_set))
        assert (validated.model_dump(), validated.model_fields_set) == (rule.model_dump(), rule.model_fields_set)
        assert validated == rule


def _as_one_root_model(data: dict[str, Any]) -> BaseModel:
    """What the config was before it was validated table by table: one root model over everything."""
    return config_model().model_validate(_one_role(data, "x"))


def _sets(model: BaseModel) -> dict[str, object]:
    """The fields_set of the root, each section and each check's table."""
    out: dict[str, object] = {"": sorted(model.model_fields_set)}
    for name in type(model).model_fields:
        table = getattr(model, name)
        out[name] = sorted(table.model_fields_set)
        if name == "checks":
            out |= {f"checks.{c}": sorted(getattr(table, c).model_fields_set) for c in type(table).model_fields}
    return out


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
    assert parsed.model_dump(mode="json") == root.model_dump(mode="json")
    assert _sets(parsed) == _sets(root)


def test_every_problem_of_every_table_at_once() -> None:
    """In the order one root model reported them: the tables in order (checks in the registry's), then unknown
    keys; each with its full key path."""
    data = {
        "daemon": {"listen": "nowhere", "peer_timeout_s": 0, "token": "hunter2"},
        "checks": {"vllm": {"base_url": "127.0.0.1:8000"}, "gpuu": {}, "infiniband": {"thresholds": {"x": []}}},
        "bundel": {},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    paths = [path for path, _ in err.value.problems]
    assert paths == [
        "daemon.listen",
        "daemon.token",
        "daemon.peer_timeout_s",
        "checks.infiniband.thresholds.x",
        "checks.vllm.base_url",
        "checks.gpuu",
        "bundel",
    ]
    reasons = dict(err.value.problems)
    assert "hunter2" not in str(err.value) and "value not shown" in reasons["daemon.token"]
    assert reasons["checks.gpuu"] == "unknown key (did you mean 'gpu'?)"
    assert reasons["bundel"] == "unknown key (did you mean 'bundle'?)"


def test_a_check_table_that_is_not_a_table() -> None:
    for data, path in (({"checks": 5}, "checks"), ({"checks": {"vllm": 5}}, "checks.vllm"), ({"daemon": 5}, "daemon")):
        with pytest.raises(ConfigError) as err:
            parse_config(data)
        [(where, reason)] = err.value.problems
        assert where == path and "valid dictionary" in reason and "(got 5)" in reason


def test_a_config_builds_only_the_schemas_of_the_tables_it_names() -> None:
    """What a start costs in pydantic-core's heap: a schema (validator and serializer) per table the config names,
    none for the others (a deferred model's validator is a placeholder until its first validation)."""
    code = """
import json
from pydantic_core import SchemaValidator
from dgxdoctor.config import check_models, parse_config, section_models
from dgxdoctor.judge.infiniband import CounterThreshold
from dgxdoctor.settings.remediation import RemediationCommands
config = parse_config(CONFIG)
models = [*section_models().values(), *check_models().values(), CounterThreshold, RemediationCommands]
built = sorted(m.__name__ for m in models if isinstance(m.__dict__.get("__pydantic_validator__"), SchemaValidator))
print(json.dumps([built, config.daemon.peer_timeout_s]))
"""
    for config, built in (({}, []), ({"daemon": {"peer_timeout_s": 2}}, ["DaemonSettings"])):
        out = json.loads(fresh_python(code.replace("CONFIG", repr(config))))
        assert out[0] == built
    assert out[1] == 2

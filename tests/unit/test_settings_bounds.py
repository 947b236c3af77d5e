"""Every duration and count a config holds has a finite bound (issue 34: ``command_timeout_s = inf`` held the
one-action lock for good behind a hung systemctl; a 26-digit ``budget`` was taken).

The walk covers every settings table (the config's, every check's, and any other ``Frozen`` record, such as the
peer's join request), so a numeric field added without a bound fails here. That every default lies within its
bounds is tests/unit/test_cli_core.py's: it loads the generated example, every default, through validation.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import pytest
from msgspec import Meta, Struct
from msgspec.structs import fields

import dgxdoctor
from dgxdoctor.config import ConfigError, config_model, load_config
from dgxdoctor.settings.base import Frozen
from dgxdoctor.validation import ByteCount


def _bounds(metas: list[Meta]) -> tuple[list[float], list[float]]:
    """Lower and upper bounds of a field: msgspec's own (``_numbers`` gives a ``ByteCount``'s as a ``Meta``)."""
    low = [v for m in metas for v in (m.ge, m.gt) if v is not None]
    high = [v for m in metas for v in (m.le, m.lt) if v is not None]
    return low, high


def _numbers(hint: Any, metas: tuple[Meta, ...] = ()) -> Iterator[tuple[type, list[Meta]]]:
    """Every int or float a type holds (in unions, lists, table values), with the ``Meta`` that bound it."""
    while get_origin(hint) is Annotated:
        metas = (*metas, *(m for m in hint.__metadata__ if isinstance(m, Meta)))
        hint = get_args(hint)[0]
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        for arg in get_args(hint):
            yield from _numbers(arg, metas)
    elif origin in (list, tuple, set, frozenset, dict):
        for arg in get_args(hint):  # a container's own Meta bounds its length, not its items
            if arg is not Ellipsis:
                yield from _numbers(arg)
    elif isinstance(hint, type) and issubclass(hint, ByteCount):  # its class names its bounds (validation.py)
        yield hint, [*metas, Meta(ge=hint.low, le=hint.high)]
    elif isinstance(hint, type) and issubclass(hint, int | float) and not issubclass(hint, bool):
        yield hint, list(metas)


def _tables() -> set[type[Struct]]:
    for info in pkgutil.walk_packages(dgxdoctor.__path__, "dgxdoctor."):
        # The dashboards' generator needs Grafana's SDK (Python 3.11+, a build-time extra); it holds no settings.
        if not info.name.endswith("__main__") and not info.name.startswith("dgxdoctor.dashboards."):
            importlib.import_module(info.name)
    found: set[type[Struct]] = set()
    todo: list[type[Struct]] = [config_model(), Frozen]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.add(model)
        # The package's own tables: a settings class a test defines (test_check_settings_typed) is not shipped.
        todo.extend(sub for sub in model.__subclasses__() if sub.__module__.startswith("dgxdoctor."))
        for f in fields(model):
            todo.extend(_structs(f.type))
    return found


def _structs(hint: Any) -> Iterator[type[Struct]]:
    if isinstance(hint, type) and issubclass(hint, Struct):
        yield hint
    for arg in get_args(hint):
        yield from _structs(arg)


def unbounded_fields() -> list[str]:
    bad = []
    for model in _tables():
        hints = get_type_hints(model, include_extras=True)
        for name in model.__struct_fields__:
            for kind, metas in _numbers(hints[name]):
                low, high = _bounds(metas)
                if not (low and high and all(math.isfinite(v) for v in (*low, *high))):
                    bad.append(f"{model.__module__}.{model.__qualname__}.{name} ({kind.__name__}: {low} .. {high})")
    return sorted(bad)


def test_every_numeric_setting_has_finite_bounds() -> None:
    assert unbounded_fields() == []


def test_the_walk_sees_the_fields_of_issue_34() -> None:
    """The walk is not vacuous: the fields the issue names are among the numeric ones it judges."""
    seen = {
        f"{m.__qualname__}.{name}"
        for m in _tables()
        for name, hint in get_type_hints(m, include_extras=True).items()
        if name in m.__struct_fields__ and list(_numbers(hint))
    }
    for name in ("RemediationSettings.hold_s", "RemediationSettings.command_timeout_s",
                 "RemediationSettings.cooldown_s", "RemediationSettings.budget", "VllmSettings.timeout_s",
                 "LogsSettings.max_bytes_per_run", "JoinRequest.join_timeout_s"):  # fmt: skip
        assert name in seen


def problems_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "dgxdoctor.toml"
    path.write_text('[node]\nrole = "head"\n' + text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    return str(err.value)


@pytest.mark.parametrize(
    ("table", "key"),
    [("remediation", "hold_s"), ("remediation", "command_timeout_s"), ("checks.vllm", "timeout_s"),
     ("remediation", "budget_window_s"), ("checks.logs", "hold_s"), ("checks.infiniband", "flap_window_s")],
)  # fmt: skip
@pytest.mark.parametrize("value", ["inf", "nan", "1e30", "-inf"])
def test_infinite_nan_and_huge_durations_are_refused_naming_the_key(tmp_path: Path, table: str, key: str,
                                                                     value: str) -> None:  # fmt: skip
    message = problems_of(tmp_path, f"[{table}]\n{key} = {value}\n")
    # "  remediation: Expected `float` <= 3600.0 - at `$.remediation.command_timeout_s`" (> 0.0 for nan)
    line = rf"^  {re.escape(table)}: Expected `float` (?:<=|>=|>) [0-9.]+ - at `\$\.{re.escape(table)}\.{key}`$"
    assert re.search(line, message, re.M), message


@pytest.mark.parametrize("value", ["inf", "nan", "1e30"])
def test_cooldowns_are_bounded(tmp_path: Path, value: str) -> None:
    message = problems_of(tmp_path, f"[remediation]\ncooldown_s = {{restart_vllm = {value}}}\n")
    assert re.search(r"^  remediation: Expected `float` [<>]=? [0-9.]+ - at `\$\.remediation\.cooldown_s\[\.\.\.\]`$",
                     message, re.M), message  # fmt: skip


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [("remediation", "budget", "1" + "0" * 25), ("checks.ray", "expected_nodes", "100000000000"),
     ("checks.logs", "max_bytes_per_run", "1" + "0" * 25), ("checks.ras", "max_bytes", '"999999999999G"')],
)  # fmt: skip
def test_huge_counts_are_refused_naming_the_key(tmp_path: Path, table: str, key: str, value: str) -> None:
    message = problems_of(tmp_path, f"[{table}]\n{key} = {value}\n")
    assert f"{table}: " in message and f"at `$.{table}.{key}`" in message, message
    assert "<=" in message or "at most" in message, message

"""dgxdoctor.validation: untrusted data into Structs, every problem at once, each at its key path."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from msgspec import Meta, Struct, field

from dgxdoctor.sources.fields import ByteCount, HttpUrl, bytes_within
from dgxdoctor.validation import Invalid, Secret, dump, field_rule, record_rule, rule, validate


def _even(value: int) -> int:
    if value % 2:
        raise ValueError(f"{value} is odd")
    return value


class Rule(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    limit: Annotated[float, Meta(ge=0)] = 0.0
    kind: Literal["rate", "increase"] = "rate"


class Table(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    port: Annotated[int, Meta(ge=1, le=65535)] = 80
    url: HttpUrl | None = None
    evens: list[Annotated[int, rule(_even)]] = field(default_factory=list)
    rules: dict[str, Rule] = field(default_factory=dict)
    size: Annotated[ByteCount, bytes_within(1024, 1 << 20)] = ByteCount(4096)
    low: int = 0
    high: int = 10
    key: Secret | None = None
    path: Path = Path("/sys")
    names: tuple[str, ...] = ()

    @field_rule("names")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a name is listed twice")
        return value

    @record_rule
    def _ordered(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")


def problems(data: object) -> list[tuple[str, str]]:
    with pytest.raises(Invalid) as caught:
        validate(Table, data)
    return [(".".join(map(str, p.path)), p.reason) for p in caught.value.problems]


def test_every_problem_at_once_in_the_fields_order() -> None:
    found = problems({"names": ["a", "a"], "bogus": 1, "url": "ftp://x", "port": 0, "evens": [2, 3]})
    assert [path for path, _ in found] == ["port", "url", "evens.1", "names", "bogus"]
    reasons = dict(found)
    assert reasons["port"] == "expected int >= 1"
    assert "is not an http(s)://HOST:PORT" in reasons["url"]
    assert reasons["evens.1"] == "3 is odd"
    assert reasons["names"] == "a name is listed twice"
    assert reasons["bogus"] == "unknown key"


def test_a_dicts_key_is_named_in_the_path() -> None:
    found = problems({"rules": {"ok": {"limit": 1}, "bad": {"limit": -1, "kindd": "rate"}}})
    assert found == [("rules.bad.limit", "expected float >= 0.0"), ("rules.bad.kindd", "unknown key")]


def test_a_bad_item_is_reported_once_not_again_as_its_missing_list() -> None:
    class Doc(Struct, kw_only=True):
        items: list[Rule]

    with pytest.raises(Invalid) as caught:
        validate(Doc, {"items": [{"limit": "x"}]})
    assert [p.path for p in caught.value.problems] == [("items", 0, "limit")]


def test_a_cross_field_rule_runs_once_the_fields_pass() -> None:
    assert problems({"low": 11}) == [("", "low 11 is above high 10")]
    assert [path for path, _ in problems({"low": 11, "port": 0})] == ["port"]


def test_rules_may_change_the_value_and_custom_types_decode() -> None:
    table = validate(Table, {"url": "http://dgx-a:8000/", "size": "64K", "key": "s3cret", "path": "/x"})
    assert table.url == "http://dgx-a:8000"
    assert table.size == 65536 and isinstance(table.size, ByteCount)
    assert isinstance(table.key, Secret) and table.key.get_secret_value() == "s3cret"
    assert table.path == Path("/x")
    assert problems({"size": "512"}) == [("size", "expected at least 1024 bytes (1K), got 512")]
    assert problems({"size": "2M"}) == [("size", "expected at most 1M (1048576 bytes), got 2097152")]
    assert problems({"size": True})[0][0] == "size"


def test_a_secret_is_never_shown() -> None:
    table = validate(Table, {"key": "s3cret"})
    assert "s3cret" not in repr(table) and "s3cret" not in str(dump(table))
    assert dump(table)["key"] == "**********"


def test_a_choice_names_the_choices() -> None:
    assert problems({"rules": {"r": {"kind": "sometimes"}}}) == [
        ("rules.r.kind", "invalid enum value 'sometimes' (expected 'rate' or 'increase')")
    ]


def test_not_a_table_at_all() -> None:
    assert problems([1, 2]) == [("", "expected object, got array")]


def test_code_built_records_are_trusted_and_equal_the_validated_defaults() -> None:
    assert Table() == validate(Table, {})


def test_a_peers_non_finite_sample_is_absent_and_the_rest_kept() -> None:
    """Python's JSON reads NaN and Infinity, which JSON itself has not: the sample is kept, valueless."""
    import json

    from dgxdoctor.documents import ResultsDocument

    body = (
        '{"node": "b", "checks": [{"name": "g", "samples": [{"name": "m", "value": NaN}, {"name": "m", "value": 2}]}]}'
    )
    doc = validate(ResultsDocument, json.loads(body))
    assert [s.value for s in doc.checks[0].samples] == [None, 2.0]

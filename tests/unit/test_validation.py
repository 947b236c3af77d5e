"""dgxdoctor.validation: untrusted data into Structs by msgspec itself; our classes through its hooks, our rules in
``__post_init__``, every problem reported with msgspec's key path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest
from msgspec import Meta, Struct, field

from dgxdoctor.validation import ByteCount, Clipped, HttpUrl, PeerUrl, Secret, decode_json, dump, validate


class Kilobytes(ByteCount):
    low = 1024
    high = 1 << 20


class Rule(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    limit: Annotated[float, Meta(ge=0)] = 0.0
    kind: Literal["rate", "increase"] = "rate"


class Table(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    port: Annotated[int, Meta(ge=1, le=65535)] = 80
    url: HttpUrl | None = None
    peers: tuple[PeerUrl, ...] = ()
    rules: dict[str, Rule] = field(default_factory=dict)
    size: Kilobytes = Kilobytes(4096)
    low: int = 0
    high: int = 10
    key: Secret | None = None
    path: Path = Path("/sys")

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")


def problem(data: object) -> str:
    with pytest.raises(msgspec.ValidationError) as caught:
        validate(Table, data)
    return str(caught.value)


def test_msgspecs_message_names_the_key_path() -> None:
    assert problem({"port": 0}) == "Expected `int` >= 1 - at `$.port`"
    assert problem({"bogus": 1}) == "Object contains unknown field `bogus`"
    assert problem({"rules": {"bad": {"limit": -1}}}) == "Expected `float` >= 0.0 - at `$.rules[...].limit`"
    assert problem({"rules": {"r": {"kind": "sometimes"}}}) == "Invalid enum value 'sometimes' - at `$.rules[...].kind`"
    assert problem([1, 2]) == "Expected `object`, got `array`"


def test_a_rule_across_fields_is_reported_at_the_records_path() -> None:
    assert problem({"low": 11}) == "low 11 is above high 10"

    class Outer(Struct):
        inner: list[Table]

    with pytest.raises(msgspec.ValidationError, match=r"low 11 is above high 10 - at `\$.inner\[1\]`"):
        validate(Outer, {"inner": [{}, {"low": 11}]})


def test_our_classes_decode_through_the_hook() -> None:
    table = validate(
        Table,
        {"url": "http://dgx-a:8000/", "peers": ["http://dgx-b:9835/"], "size": "64K", "key": "s3cret", "path": "/x"},
    )
    assert table.url == "http://dgx-a:8000" and isinstance(table.url, HttpUrl)
    assert table.peers == ("http://dgx-b:9835",)
    assert table.size == 65536 and isinstance(table.size, Kilobytes)
    assert isinstance(table.key, Secret) and table.key.get_secret_value() == "s3cret"
    assert table.path == Path("/x")


def test_a_hooks_problem_carries_the_path() -> None:
    assert "is not an http(s)://HOST:PORT[/PATH] URL - at `$.url`" in problem({"url": "ftp://x"})
    assert problem({"peers": ["http://ok:1", "http://x:1/a"]}).endswith(
        "give only scheme, host and port - at `$.peers[1]`"
    )
    assert problem({"size": "512"}) == "expected at least 1024 bytes (1K), got 512 - at `$.size`"
    assert problem({"size": "2M"}) == "expected at most 1M (1048576 bytes), got 2097152 - at `$.size`"
    assert problem({"size": True}).endswith("got bool - at `$.size`")
    assert problem({"path": "/a\x00b"}) == "a path may not contain a NUL character - at `$.path`"


def test_a_password_in_a_url_is_not_repeated() -> None:
    message = problem({"url": "http://admin:hunter2@dgx-b:9835/?x=1"})
    assert "hunter2" not in message and "***@dgx-b" in message


def test_a_secret_is_never_shown() -> None:
    table = validate(Table, {"key": "s3cret"})
    assert "s3cret" not in repr(table) and "s3cret" not in str(dump(table))
    assert dump(table)["key"] == "**********"
    assert "s3cret" not in problem({"key": 12345})


def test_code_built_records_equal_the_validated_defaults() -> None:
    assert Table() == validate(Table, {})


def test_a_json_body_is_decoded_with_the_same_hooks() -> None:
    assert decode_json(b'{"url": "http://x:1/"}', Table).url == "http://x:1"
    with pytest.raises(msgspec.ValidationError, match=r"at `\$.port`"):
        decode_json(b'{"port": 1e400}', Table)
    with pytest.raises(msgspec.DecodeError):
        decode_json(b'{"port": NaN}', Table)


class Short(Clipped):
    limit = 4


class Words(Struct):
    words: list[Short]


def test_clipped_text_is_cut_not_refused() -> None:
    assert validate(Words, {"words": ["abcdefgh", "ab"]}).words == ["abcd", "ab"]


def test_a_peers_non_finite_sample_is_absent_and_the_rest_kept() -> None:
    """Python's JSON reads NaN and Infinity, which JSON itself has not: the peer's answer reads them as absent."""
    from dgxdoctor.documents import ResultsDocument
    from dgxdoctor.fleet.peers import response_json

    body = (
        b'{"node": "b", "checks": [{"name": "g", "samples": [{"name": "m", "value": NaN}, {"name": "m", "value": 2}]}]}'
    )
    doc = validate(ResultsDocument, response_json(body))
    assert [s.value for s in doc.checks[0].samples] == [None, 2.0]
    assert json.loads(json.dumps(doc.dumped()))["checks"][0]["samples"][0]["value"] is None


def test_no_record_is_written_after_it_is_built() -> None:
    """Issue 36: a rule raises, a hook returns the value to keep; nothing writes into a frozen record."""
    src = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
    writers = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if any(word in path.read_text(encoding="utf-8") for word in ("force_setattr", "object.__setattr__"))
    ]
    assert writers == []

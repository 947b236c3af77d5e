"""Untrusted data (a config table, a peer's JSON) into ``msgspec.Struct`` records, every problem at once, each with
its key path.

msgspec checks the types and the ``Meta`` bounds (``Annotated[float, Meta(gt=0)]``), and stops at the first
problem. The value at that path is then left out (its default stands in) and the rest is validated again, so one
pass reports what one bad key would hide. What a type cannot say is a rule: ``Annotated[str, rule(http_url)]`` runs
``http_url`` on the value (a ValueError is the problem; what it returns replaces the value: ``http://x/`` becomes
``http://x``); a ``field_rule`` method does the same for the fields it names, and a ``record_rule`` method checks
what spans a record's fields (``min_bytes <= max_bytes``).

A class msgspec does not know is decoded by its ``decode`` classmethod (``Secret``, a byte count written ``"64M"``);
``Path`` from a string. Constructing a record in code validates nothing: code and defaults are trusted, input is not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePath
from types import EllipsisType, UnionType
from typing import Annotated, Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec
from msgspec import Meta, Struct
from msgspec.structs import force_setattr

T = TypeVar("T")
D = TypeVar("D")
KeyPath = tuple[str | int, ...]
RULE = "rule"
# How many problems one validation reports: a pasted file of garbage is not reported line by line.
MAX_PROBLEMS = 50


class Problem(Struct, frozen=True):
    """What is wrong at ``path`` (keys and list indexes below the validated value); ``value`` is what was there."""

    path: KeyPath
    reason: str
    value: Any = msgspec.UNSET  # UNSET: the problem is about no one value (a rule across fields)
    unknown_key: bool = False


class Invalid(ValueError):
    """The data does not validate; ``problems`` holds all of them, in the order of the data."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{key_path(p.path)}: {p.reason}" for p in problems))


def key_path(path: KeyPath) -> str:
    """``("peers", 1)`` -> ``peers.1``: the dotted spelling a TOML key and a JSON pointer reader both follow."""
    return ".".join(str(part) for part in path)


def rule(check: Callable[[Any], Any]) -> Meta:
    """``Annotated[str, rule(host)]``: ``check`` runs on the decoded value (on each item of a list or tuple of such
    values); it raises ValueError naming what is wrong, or returns the value to keep."""
    return Meta(extra={RULE: check})


class Secret:
    """A secret setting: never shown by ``repr``, ``str`` or a dump (``encode_hook``), only by
    ``get_secret_value()``."""

    __slots__ = ("_value",)
    toml_type: ClassVar[str] = "str (a secret)"

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def decode(cls, value: object) -> Secret:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return cls(value)

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__


def decode_hook(kind: type, value: Any) -> Any:
    """msgspec's ``dec_hook``: ``Path`` from a string, other classes by their ``decode`` classmethod."""
    if kind is Path or kind is PurePath:
        if isinstance(value, PurePath):
            return Path(value)
        if not isinstance(value, str):
            raise TypeError(f"expected a path (string), got {type(value).__name__}")
        if "\x00" in value:
            raise ValueError("a path may not contain a NUL character")
        return Path(value)
    decode = getattr(kind, "decode", None)
    if decode is None:
        raise NotImplementedError(f"no decoder for {kind.__name__}")
    return decode(value)


def encode_hook(value: Any) -> Any:
    """msgspec's ``enc_hook`` for a dump (``to_builtins``): paths as strings, secrets masked, ints as ints."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Secret):
        return "**********"
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    raise NotImplementedError(f"cannot dump {type(value).__name__}")


def dump(record: Any) -> Any:
    """``record`` as JSON-ready builtins (a config table for the bundle or the example config): secrets masked."""
    return msgspec.to_builtins(record, enc_hook=encode_hook)


def validate(model: type[T], data: Any, limit: int = MAX_PROBLEMS) -> T:
    """``data`` as ``model``; ``Invalid`` with every problem found otherwise, at most ``limit`` of them (each one
    more is another conversion of the whole: a peer's document is refused at its first)."""
    problems: list[Problem] = []
    value = _converted(model, data, problems, limit)
    if value is not None and len(problems) < limit:
        _check_rules(value, (), problems, cross=not problems)
    if problems:
        problems.sort(key=lambda problem: _order(model, data, problem.path))
        raise Invalid(problems[:limit])
    assert value is not None
    return value


def _converted(model: type[T], data: Any, problems: list[Problem], limit: int) -> T | None:
    """msgspec's conversion, again without each bad value until it passes (or nothing more can be left out)."""
    left_out: set[KeyPath] = set()
    while True:
        try:
            return msgspec.convert(data, model, dec_hook=decode_hook)
        except msgspec.ValidationError as exc:
            problem = _problem(exc, model, data)
            if problem.path in left_out:  # a required key left out for its bad value: already reported
                return None
            problems.append(problem)
            left_out.add(_holder(problem.path))
            data = _without(data, problem.path)
            if data is None or len(problems) >= limit:
                return None


# "Expected `int` >= 1 - at `$.checks[0].port`", "Object contains unknown field `x` - at `$.a`",
# "Invalid enum value 'z' - at `key` in `$.cd`" (msgspec's ValidationError texts)
_AT = re.compile(r"^(?P<msg>.*?) - at (?:`key` in )?`\$(?P<path>[^`]*)`$", re.DOTALL)
_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<key>.*)`$", re.DOTALL)


def _problem(exc: msgspec.ValidationError, model: Any, data: Any) -> Problem:
    text = str(exc)
    match = _AT.match(text)
    message, parts = (match["msg"], _parts(match["path"])) if match else (text, ())
    path = _keyed(model, data, parts, message) if ... in parts else tuple(p for p in parts if p is not ...)
    unknown = _UNKNOWN.match(message)
    if unknown:
        path = (*path, unknown["key"])
        return Problem(path, "unknown key", _at(data, path), unknown_key=True)
    missing = _MISSING.match(message)
    if missing:
        return Problem((*path, missing["key"]), "required, missing")
    reason = _plain_words(message)
    if message.startswith("Invalid enum value"):
        choices = [repr(c) for c in get_args(bare_type(_type_at(model, path))) if isinstance(c, str | int)]
        if choices:
            reason += f" (expected {' or '.join(filter(None, [', '.join(choices[:-1]), choices[-1]]))})"
    return Problem(path, reason, _at(data, path))


def child_type(model: Any, part: str | int) -> Any:
    """The declared type one step below ``model``: a record's field, a dict's value, a list's item; Any where it
    cannot be told."""
    hint = bare_type(model)
    if isinstance(hint, type) and issubclass(hint, Struct):
        return get_type_hints(hint, include_extras=True)[part] if part in hint.__struct_fields__ else Any
    args = get_args(hint)
    if get_origin(hint) is dict and len(args) == 2:
        return args[1]
    if get_origin(hint) in (list, tuple, set, frozenset) and args:
        return args[0]
    return Any


def _type_at(model: Any, path: KeyPath) -> Any:
    for part in path:
        model = child_type(model, part)
    return model


def _order(model: Any, data: Any, path: KeyPath) -> tuple[int, ...]:
    """Where ``path`` comes in the documented order: a record's fields in their order (unknown keys after them, as
    written), a dict's keys and a list's items as written."""
    key: list[int] = []
    for part in path:
        hint = bare_type(model)
        fields = hint.__struct_fields__ if isinstance(hint, type) and issubclass(hint, Struct) else None
        if fields is not None and part in fields:
            key.append(fields.index(str(part)))
        else:
            key.append((len(fields) if fields is not None else 0) + _index(data, part))
        model, data = child_type(model, part), _at(data, (part,))
    return tuple(key)


def _index(data: Any, part: str | int) -> int:
    if isinstance(part, int):
        return part
    return list(data).index(part) if isinstance(data, dict) and part in data else 0


def _parts(text: str) -> tuple[str | int | EllipsisType, ...]:
    """``.a[0].b`` -> ("a", 0, "b"); msgspec writes a dict's key as ``[...]``: Ellipsis."""
    return tuple(name if not index else ... if index == "..." else int(index) for name, index in _PART.findall(text))


def _keyed(model: Any, data: Any, parts: tuple[str | int | EllipsisType, ...], message: str) -> KeyPath:
    """``parts`` with each ``[...]`` replaced by the dict key whose value fails the same way: converted alone
    against the dict's value type, the first key that raises ``message``."""
    path: list[str | int] = []
    for index, part in enumerate(parts):
        if part is ...:
            key = _failing_key(child_type(model, ""), data, message) if isinstance(data, dict) else None
            if key is None:
                return (*path, *(p for p in parts[index:] if p is not ...))  # type: ignore[misc]
            part = key
        path.append(part)
        model, data = child_type(model, part), _at(data, (part,))
    return tuple(path)


def _failing_key(value_type: Any, data: dict[Any, Any], message: str) -> str | None:
    for key, value in data.items():
        try:
            msgspec.convert(value, value_type, dec_hook=decode_hook)
        except msgspec.ValidationError as exc:
            if str(exc).startswith(message):
                return str(key)
    return None


def bare_type(hint: Any) -> Any:
    """``hint`` without ``Annotated`` and ``| None``."""
    while get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    if get_origin(hint) is Union or isinstance(hint, UnionType):
        kinds = [arg for arg in get_args(hint) if arg is not type(None)]
        return bare_type(kinds[0]) if len(kinds) == 1 else hint
    return hint


# "Expected `str` of length >= 16": a reader of a config file counts characters
_LENGTH = re.compile(r"^Expected `str` of length (>=|<=) (\d+)$")


def _plain_words(message: str) -> str:
    length = _LENGTH.match(message)
    if length:
        bound = "at least" if length[1] == ">=" else "at most"
        return f"expected a string of {bound} {length[2]} characters"
    return _lower_first(message.replace("`", ""))


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _at(data: Any, path: KeyPath) -> Any:
    """The value at ``path`` in ``data``; UNSET where there is none."""
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return msgspec.UNSET
    return data


def _holder(path: KeyPath) -> KeyPath:
    """The key ``_without`` leaves out for a problem at ``path``: the whole list for a bad item."""
    return path[: next((i for i, part in enumerate(path) if isinstance(part, int)), len(path))]


def _without(data: Any, path: KeyPath) -> Any:
    """``data`` less the key that holds the bad value (``_holder``); None when there is no such key (the problem is
    the value as a whole)."""
    keys = _holder(path)
    if not keys or not isinstance(data, dict):
        return None
    head, rest = keys[0], keys[1:]
    if head not in data:
        return None
    if not rest:
        return {k: v for k, v in data.items() if k != head}
    inner = _without(data[head], rest)
    return None if inner is None else {**data, head: inner}


def field_rule(*fields: str) -> Callable[[D], D]:
    """Marks a classmethod ``(cls, value) -> value`` of a record as the rule of ``fields`` (the whole value of each)."""

    def mark(method: D) -> D:
        target: Any = getattr(method, "__func__", method)
        target.__rule_fields__ = fields
        return method

    return mark


def record_rule(method: D) -> D:
    """Marks a method ``(self) -> Any`` of a record that checks what spans its fields; it raises ValueError."""
    method.__record_rule__ = True  # type: ignore[attr-defined]
    return method


def _check_rules(value: Any, path: KeyPath, problems: list[Problem], cross: bool) -> None:
    """Every rule below ``value``; the cross-field ones (``cross``) only where no value had a problem: they would
    read the default that stands in for a bad value."""
    if isinstance(value, Struct):
        _check_record(value, path, problems, cross)
    elif isinstance(value, (list, tuple)):
        kind: type = type(value[0]) if value else type(None)
        if value and _inert(kind) and all(type(item) is kind for item in value):
            return  # records with no rule anywhere (a document's thousands of samples)
        for index, item in enumerate(value):
            _check_rules(item, (*path, index), problems, cross)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_rules(item, (*path, key), problems, cross)


def _checked(check: Callable[[Any], Any], value: Any, per_item: bool, path: KeyPath, problems: list[Problem]) -> Any:
    """``check`` over the value (or each item, each dict value); a ValueError is a problem at its path."""
    if not per_item:
        try:
            return check(value)
        except ValueError as exc:
            problems.append(Problem(path, str(exc), value))
            return value
    items = value.items() if isinstance(value, dict) else enumerate(value)
    done = {key: _checked(check, item, False, (*path, key), problems) for key, item in items}
    return done if isinstance(value, dict) else type(value)(done.values())


def _check_record(record: Struct, path: KeyPath, problems: list[Problem], cross: bool) -> None:
    before = len(problems)
    for name, check, per_item in _rules(type(record)):
        current = getattr(record, name)
        if current is None:
            continue
        checked = _checked(check, current, per_item, (*path, name), problems)
        if checked is not current:
            force_setattr(record, name, checked)
    for name in _nested(type(record)):
        _check_rules(getattr(record, name), (*path, name), problems, cross)
    if not cross or len(problems) > before:  # a cross-field rule reads fields that passed their own
        return
    for name in _record_rules(type(record)):
        try:
            getattr(record, name)()
        except ValueError as exc:
            problems.append(Problem(path, str(exc)))


Rule = tuple[str, Callable[[Any], Any], bool]


@cache
def _rules(model: type[Struct]) -> tuple[Rule, ...]:
    """(field, check, on each item) for each rule on ``model``'s fields (its types', then its ``field_rule``
    methods'), in field order."""
    hints = get_type_hints(model, include_extras=True)
    methods = _marked(model, "__rule_fields__")
    return tuple(
        (name, check, per_item)
        for name in model.__struct_fields__
        for check, per_item in [
            *_rules_of(hints[name]),
            *((getattr(model, method), False) for method, fields in methods if name in fields),
        ]
    )


@cache
def _inert(kind: type) -> bool:
    """A record type with no rule of any kind, nor records inside: nothing to check below it."""
    if not issubclass(kind, Struct):
        return not issubclass(kind, (list, tuple, dict))
    return not (_rules(kind) or _nested(kind) or _record_rules(kind))


@cache
def _nested(model: type[Struct]) -> tuple[str, ...]:
    """The fields whose values may hold records (their rules are checked in turn); the others are leaves."""
    hints = get_type_hints(model, include_extras=True)
    return tuple(name for name in model.__struct_fields__ if _holds_record(hints[name]))


def _holds_record(hint: Any) -> bool:
    # ``get_origin``: Python 3.10 says ``isinstance(list[X], type)``; a generic alias is never a record itself.
    if isinstance(hint, type) and get_origin(hint) is None:
        return issubclass(hint, Struct)
    return hint is Any or any(_holds_record(arg) for arg in get_args(hint) if arg is not Ellipsis)


@cache
def _record_rules(model: type[Struct]) -> tuple[str, ...]:
    return tuple(name for name, _ in _marked(model, "__record_rule__"))


def _marked(model: type, mark: str) -> list[tuple[str, Any]]:
    """(name, mark's value) of the methods of ``model`` and its bases that carry ``mark``."""
    found: dict[str, Any] = {}
    for klass in reversed(model.__mro__):
        for name, attr in vars(klass).items():
            value = getattr(getattr(attr, "__func__", attr), mark, None)
            if value is not None:
                found[name] = value
    return list(found.items())


def _rules_of(hint: Any, per_item: bool = False) -> list[tuple[Callable[[Any], Any], bool]]:
    """The rules on a field's type: on it, inside ``X | None``, or on the items of a list or tuple (a dict's
    values)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        extras = [m.extra for m in hint.__metadata__ if isinstance(m, Meta) and m.extra and RULE in m.extra]
        return [(extra[RULE], per_item) for extra in extras] + _rules_of(args[0], per_item)
    if origin is Union or isinstance(hint, UnionType):
        return [found for arg in args for found in _rules_of(arg, per_item)]
    if origin in (list, tuple, set, frozenset) and not per_item:
        return [found for arg in args if arg is not Ellipsis for found in _rules_of(arg, True)]
    if origin is dict and args and not per_item:  # the values' rules
        return _rules_of(args[1], True)
    return []

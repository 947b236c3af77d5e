"""Untrusted data (a config table, a peer's document, a request body) into ``msgspec.Struct`` records, by msgspec.

msgspec checks the types and the ``Meta`` bounds and raises ``msgspec.ValidationError`` at the first problem, its
message ending in the key path (``Expected `int` >= 1 - at `$.checks.nccl.master_port```). What spans a record's
fields is its ``__post_init__``: a ValueError raised there is reported the same way, with the record's path. A value
msgspec has no type for is one of the classes below, built by ``dec_hook`` (a ValueError or TypeError there names
what is wrong, and msgspec adds the path): a URL, a host, a byte size written ``"64M"``, a secret, a path.

Nothing here reads msgspec's messages: callers report them as they are.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path, PurePath
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import msgspec

T = TypeVar("T")

# The patterns are compiled at their first use (``re``'s own cache): ``check`` imports this module on every run.
# One DNS label (RFC 1123): letters, digits, inner hyphens; a host name is dot-separated labels, 253 at most.
_LABEL = r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z"
# A message size as nccl-tests and the bundled probe take it: 8M, 1G, 512K, 1048576, 8MB (any case).
_BYTE_SIZE = r"(?i)^(?P<number>[0-9]{1,12})(?P<unit>[KMG]?)B?$"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# user:password@ in a URL (http://admin:pw@dgx-b:9835): a password is not repeated in an error.
_USERINFO = r"://[^/@\s'\"]*@"
MASK = "**********"


class Secret:
    """A secret setting: never shown by ``repr``, ``str`` or a dump (``enc_hook``), only by
    ``get_secret_value()``."""

    __slots__ = ("_value",)
    toml_type: ClassVar[str] = "str (a secret)"

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"Secret('{MASK}')"

    __str__ = __repr__


def parse_byte_size(value: str) -> int:
    """``8M`` -> 8388608 (K, M, G are binary, as nccl-tests reads them); ValueError when it is not a size."""
    match = re.match(_BYTE_SIZE, value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a size (use e.g. 8M, 1G, 512K or a number of bytes)")
    return int(match["number"]) * _UNITS[match["unit"].upper()]


def spelled(size: int) -> str:
    """16 GiB -> "16G", 1 -> "1 B": a size as the operator writes it."""
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return f"{size} B"


class ByteCount(int):
    """A number of bytes a setting holds, ``low`` .. ``high``: 67108864 or, in ``ByteSize``'s units, ``"64M"``.
    A setting with other bounds is a subclass naming them."""

    toml_type: ClassVar[str] = "int"
    low: ClassVar[int] = 0
    high: ClassVar[int] = 1 << 50

    @classmethod
    def parse(cls, value: object) -> ByteCount:
        if isinstance(value, str):
            count = parse_byte_size(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            count = value
        else:
            raise TypeError(f"expected a number of bytes or a size such as 64M, got {type(value).__name__}")
        if count < cls.low:
            raise ValueError(f"expected at least {cls.low} bytes ({spelled(cls.low)}), got {count}")
        if count > cls.high:
            raise ValueError(f"expected at most {spelled(cls.high)} ({cls.high} bytes), got {count}")
        return cls(count)


class ByteSize(str):
    """A message size in its canonical spelling (``8m`` -> ``8M``), ``low`` .. ``high`` bytes, as the probe and a
    peer are given it. A size with other bounds is a subclass naming them."""

    toml_type: ClassVar[str] = "str"
    low: ClassVar[int] = 0
    high: ClassVar[int] = 1 << 50

    @classmethod
    def parse(cls, value: str) -> ByteSize:
        size = parse_byte_size(value)
        if not cls.low <= size <= cls.high:
            raise ValueError(f"{value!r} is outside {spelled(cls.low)} .. {spelled(cls.high)}")
        match = re.match(_BYTE_SIZE, value.strip())
        assert match is not None
        return cls(match["number"] + match["unit"].upper())


def sizes_in_order(smaller: str, larger: str, names: tuple[str, str] = ("min_bytes", "max_bytes")) -> None:
    """ValueError when the size meant to be the smaller is the larger."""
    if parse_byte_size(smaller) > parse_byte_size(larger):
        raise ValueError(f"{names[0]} {smaller} is larger than {names[1]} {larger}")


def host(value: str) -> str:
    """A host name or an IPv4/IPv6 address (no port, no scheme); ValueError otherwise."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(re.match(_LABEL, label) for label in labels):
        raise ValueError(f"{value!r} is not a host name or IP address")
    return value


def http_url(value: str, *, path: bool = True) -> str:
    """The one check of a configured URL: http(s) with a host and a valid port, no query, fragment or user name;
    ``path=False`` also refuses a path (a peer is scheme, host and port). Returns it without a trailing ``/``;
    ValueError naming what is wrong (a password in it not repeated)."""
    parts = urlsplit(value)
    shape = "http(s)://HOST:PORT" + ("[/PATH]" if path else "")
    shown = re.sub(_USERINFO, "://***@", repr(value))
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError as exc:
        raise ValueError(f"{shown} is not an {shape} URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{shown} is not an {shape} URL")
    if parts.query or parts.fragment or parts.username:
        raise ValueError(f"{shown}: give no query, fragment or user name ({shape})")
    if not path and parts.path not in ("", "/"):
        raise ValueError(f"{shown}: give only scheme, host and port")
    return value.rstrip("/")


class HttpUrl(str):
    """An http(s) URL (``http_url``), kept without a trailing ``/``."""

    toml_type: ClassVar[str] = "str"


class PeerUrl(str):
    """A peer's agent: scheme, host and port only."""

    toml_type: ClassVar[str] = "str"


class OptionalHttpUrl(str):
    """An http(s) URL, or ``""`` for "none" (a TOML file cannot write null): falsy when none."""

    toml_type: ClassVar[str] = "str"


class Host(str):
    """A host name or an IP address (``host``)."""

    toml_type: ClassVar[str] = "str"


class Clipped(str):
    """Text another node wrote, cut to ``limit`` characters rather than refused: one long log line in a peer's
    evidence does not cost the whole peer. A text with another limit is a subclass naming it."""

    limit: ClassVar[int] = 4096


def _path(value: object) -> Path:
    if isinstance(value, PurePath):
        return Path(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a path (string), got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError("a path may not contain a NUL character")
    return Path(value)


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def dec_hook(kind: type, value: Any) -> Any:
    """msgspec's ``dec_hook``: the classes above (and ``Path``) from what a config or a JSON body holds."""
    if kind is Path or kind is PurePath:
        return _path(value)
    if kind is Secret:
        return Secret(_string(value))
    if issubclass(kind, ByteCount):
        return kind.parse(value)
    if issubclass(kind, ByteSize):
        return kind.parse(_string(value))
    if kind is HttpUrl:
        return HttpUrl(http_url(_string(value)))
    if kind is PeerUrl:
        return PeerUrl(http_url(_string(value), path=False))
    if kind is OptionalHttpUrl:
        text = _string(value)
        return OptionalHttpUrl(text and http_url(text))
    if kind is Host:
        return Host(host(_string(value)))
    if issubclass(kind, Clipped):
        return kind(_string(value)[: kind.limit])
    raise NotImplementedError(f"no decoder for {kind.__name__}")


def enc_hook(value: Any) -> Any:
    """msgspec's ``enc_hook``: paths as strings, secrets masked, the classes above as the str or int they are."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Secret):
        return MASK
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def validate(model: type[T], data: Any) -> T:
    """``data`` as ``model``; ``msgspec.ValidationError`` at the first problem, naming its key path."""
    return msgspec.convert(data, model, dec_hook=dec_hook)


def decode_json(raw: bytes, model: type[T]) -> T:
    """A JSON body as ``model``: ``msgspec.DecodeError`` when it is not JSON (NaN and Infinity are not),
    ``msgspec.ValidationError`` (a DecodeError too) naming the key path of the first problem otherwise."""
    return msgspec.json.decode(raw, type=model, dec_hook=dec_hook)


def dump(record: Any) -> Any:
    """``record`` as JSON-ready builtins (a config table for the bundle or the example config): secrets masked."""
    return msgspec.to_builtins(record, enc_hook=enc_hook)

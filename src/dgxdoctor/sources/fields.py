"""Validated field types that every setting and the peer's join request share: URL, host, byte size.

One definition each, so a value the local config accepts is one a peer accepts too (a join request with
``min_bytes = "8m"`` used to be refused by the peer that the local check had let through). Each raises a
ValueError that names what is wrong; ``validation`` reports it with the key path.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, ClassVar
from urllib.parse import urlsplit

from msgspec import Meta

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.validation import RULE, rule

# One DNS label (RFC 1123): letters, digits, inner hyphens; a host name is dot-separated labels, 253 at most.
_LABEL = lazy_compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")
# A message size as nccl-tests and the bundled probe take it: 8M, 1G, 512K, 1048576, 8MB (any case).
_BYTE_SIZE = lazy_compile(r"^(?P<number>[0-9]{1,12})(?P<unit>[KMG]?)B?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def host(value: str) -> str:
    """A host name or an IPv4/IPv6 address (no port, no scheme)."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{value!r} is not a host name or IP address")
    return value


def parse_byte_size(value: str) -> int:
    """``8M`` -> 8388608 (K, M, G are binary, as nccl-tests reads them); ValueError when it is not a size."""
    match = _BYTE_SIZE.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a size (use e.g. 8M, 1G, 512K or a number of bytes)")
    return int(match["number"]) * _UNITS[match["unit"].upper()]


def byte_size(value: str) -> str:
    """The size in its canonical spelling (``8m`` -> ``8M``), as the probe and a peer are given it."""
    parse_byte_size(value)
    match = _BYTE_SIZE.match(value.strip())
    assert match is not None
    return match["number"] + match["unit"].upper()


def byte_size_within(value: str, low: int, high: int) -> str:
    """``value`` (a ``ByteSize``) if it lies in ``low`` .. ``high`` bytes; ValueError naming the bounds."""
    if not low <= parse_byte_size(value) <= high:
        raise ValueError(f"{value!r} is outside {_spelled(low)} .. {_spelled(high)}")
    return value


def sizes_in_order(smaller: str, larger: str, names: tuple[str, str] = ("min_bytes", "max_bytes")) -> None:
    """ValueError when the size meant to be the smaller is the larger (both ``ByteSize``)."""
    if parse_byte_size(smaller) > parse_byte_size(larger):
        raise ValueError(f"{names[0]} {smaller} is larger than {names[1]} {larger}")


def _spelled(size: int) -> str:
    """16 GiB -> "16G", 1 -> "1 B": the bound as the operator writes it."""
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return f"{size} B"


class ByteCount(int):
    """A number of bytes a setting holds: 67108864 or, in ``ByteSize``'s units, ``"64M"``."""

    toml_type: ClassVar[str] = "int"

    @classmethod
    def decode(cls, value: object) -> ByteCount:
        if isinstance(value, str):
            return cls(parse_byte_size(value))
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        raise TypeError(f"expected a number of bytes or a size such as 64M, got {type(value).__name__}")


def bytes_within(low: int, high: int) -> Meta:
    """The rule of a ``ByteCount`` of ``low`` .. ``high`` bytes; the bounds stay readable in the ``Meta``'s
    ``extra`` (``ge``, ``le``), as msgspec's own are, so a test can see that every count has them."""

    def check(value: int) -> int:
        if value < low:
            raise ValueError(f"expected at least {low} bytes ({_spelled(low)}), got {value}")
        if value > high:
            raise ValueError(f"expected at most {_spelled(high)} ({high} bytes), got {value}")
        return value

    return Meta(extra={RULE: check, "ge": low, "le": high})


def http_url(value: str, *, path: bool = True) -> str:
    """The one check of a configured URL: http(s) with a host and a valid port, no query, fragment or user name;
    ``path=False`` also refuses a path (a peer is scheme, host and port). Returns it without a trailing ``/``;
    ValueError naming what is wrong."""
    parts = urlsplit(value)
    shape = "http(s)://HOST:PORT" + ("[/PATH]" if path else "")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an {shape} URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an {shape} URL")
    if parts.query or parts.fragment or parts.username:
        raise ValueError(f"{value!r}: give no query, fragment or user name ({shape})")
    if not path and parts.path not in ("", "/"):
        raise ValueError(f"{value!r}: give only scheme, host and port")
    return value.rstrip("/")


def peer_url(value: str) -> str:
    return http_url(value, path=False)


def empty_or_url(value: str) -> str | None:
    """An http(s) URL, or None for ``""`` (a key written to say "none")."""
    return None if value == "" else http_url(value)


HttpUrl = Annotated[str, rule(http_url)]
PeerUrl = Annotated[str, rule(peer_url)]
Host = Annotated[str, rule(host)]
ByteSize = Annotated[str, rule(byte_size)]
# "" means "none" in a TOML file that cannot write null.
OptionalHttpUrl = Annotated[str | None, rule(empty_or_url)]

"""The project's record types are ``msgspec.Struct`` classes: a frozen record with ``__init__``, ``__eq__``,
``__hash__`` and ``__repr__`` costs microseconds to define, where a ``@dataclass(frozen=True)`` costs ~1.4 ms of
generated code at import (some 150 of them sit on `dgxdoctor check`'s start-up path).

``asdict`` is the recursive conversion ``dataclasses.asdict`` did (``msgspec.structs.asdict`` goes one level): Structs
become dicts, lists and tuples keep their type, everything else is left as it is.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct
from msgspec.structs import asdict as _shallow


def asdict(record: Struct) -> dict[str, Any]:
    """``record``'s fields as a dict, nested records (in lists, tuples and dict values too) converted as well."""
    return {name: _plain(value) for name, value in _shallow(record).items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Struct):
        return asdict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value

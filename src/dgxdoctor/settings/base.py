"""The one base of every settings table: unknown keys are errors, a validated table never changes."""

from __future__ import annotations

from msgspec import Struct


class Frozen(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A settings table: ``validation.validate`` builds it from a config (every problem with its key path); built
    in code (the defaults), it validates nothing."""

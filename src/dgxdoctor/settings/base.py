"""The one base of every settings table: unknown keys are errors, a validated table never changes."""

from __future__ import annotations

from msgspec import Struct


class Frozen(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A settings table: ``validation.validate`` builds it from a config (msgspec names the key path of a problem).
    Its rules across fields are its ``__post_init__``, run however it is built; its defaults are not decoded, so
    each is written as decoding would give it (``tests/unit/test_config_sections.py``)."""

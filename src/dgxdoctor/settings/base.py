"""The one base of every settings table: unknown keys are errors, a validated table never changes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    # defer_build: a table's schema (validator and serializer, in pydantic-core's heap) is built at its first
    # validation or dump, so the tables a config does not name never build one (config.parse_config).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

"""Every check, in display order. Explicit: adding a check is one line here, no import-time magic."""

from __future__ import annotations

from dgxdoctor.checks.base import CheckFactory
from dgxdoctor.checks.ray import RayCheck

ALL_CHECKS: tuple[CheckFactory, ...] = (RayCheck,)


def by_name() -> dict[str, CheckFactory]:
    return {factory.name: factory for factory in ALL_CHECKS}

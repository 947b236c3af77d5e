"""The upper bounds of durations in the settings: every duration and count a config holds is finite.

A duration of ``inf`` (TOML takes ``inf`` and ``nan`` as floats) would wait for ever: ``command_timeout_s = inf`` held
the one-action lock for good behind a hung systemctl. tests/unit/test_settings_bounds.py holds every numeric field
of every settings table to a finite bound.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

HOUR_S = 3600.0
DAY_S = 86400.0
WEEK_S = 7 * DAY_S
YEAR_S = 366 * DAY_S
# Seconds with the bounds several settings share: a wait may be 0, a timeout or a window may not. A field adds its
# own description: ``hold_s: Annotated[WaitUpToADay, Meta(description=...)] = 30.0``.
WaitUpToADay = Annotated[float, Meta(ge=0, le=DAY_S)]
TimeoutUpToAnHour = Annotated[float, Meta(gt=0, le=HOUR_S)]
TimeoutUpToADay = Annotated[float, Meta(gt=0, le=DAY_S)]
WindowUpToAWeek = Annotated[float, Meta(gt=0, le=WEEK_S)]
# Nodes or serving groups a fleet setting counts: far past any fleet, still a finite number.
MAX_FLEET = 100_000

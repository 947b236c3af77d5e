"""The upper bounds of durations in the settings: every duration and count a config holds is finite.

A duration of ``inf`` (TOML takes ``inf`` and ``nan`` as floats) would wait for ever: ``command_timeout_s = inf`` held
the one-action lock for good behind a hung systemctl. tests/unit/test_settings_bounds.py holds every numeric field
of every settings table to a finite bound.
"""

from __future__ import annotations

HOUR_S = 3600.0
DAY_S = 86400.0
WEEK_S = 7 * DAY_S
YEAR_S = 366 * DAY_S
# Nodes or serving groups a fleet setting counts: far past any fleet, still a finite number.
MAX_FLEET = 100_000

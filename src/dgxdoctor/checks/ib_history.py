"""The infiniband check's memory: counter baselines, a ring of checkpoints for per-minute and per-hour rates, and
link flap times, per port, in a small state file (``<state_dir>/infiniband.json``, written atomically) so a
restart of dgxdoctor loses no baseline.

A different boot id, a clock that went backwards, or a counter that went down (a reset: ``perfquery -R``, a driver
reload) starts a new baseline instead of producing a bogus negative rate. State only: ``judge/infiniband.py``
decides what the deltas mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct, field

from dgxdoctor.judge.infiniband import PER_SECONDS, CounterThreshold
from dgxdoctor.sources.statefile import StateFile

STATE_FILE_NAME = "infiniband.json"
STATE_VERSION = 1
# A storm of link_downed increases is remembered as at most this many flaps per run.
MAX_FLAPS_PER_RUN = 100

Checkpoints = list[tuple[float, dict[str, int]]]


class PortWindow(Struct):
    """One port's counters now and what came before: the baseline, the deltas since, the flap times."""

    now: float
    counters: dict[str, int]
    flaps: list[float]
    prev: tuple[float, dict[str, int]] | None = None  # (time, counters) of the previous run
    deltas: dict[str, int] = field(default_factory=dict)
    checkpoints: Checkpoints = field(default_factory=list)

    @property
    def elapsed(self) -> float | None:
        return None if self.prev is None else self.now - self.prev[0]


def clean_checkpoints(raw: object) -> Checkpoints:
    out: Checkpoints = []
    if not isinstance(raw, list):
        return out
    for item in raw:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int | float) and isinstance(item[1], dict):
            out.append((float(item[0]), {k: v for k, v in item[1].items() if isinstance(v, int)}))
    return sorted(out, key=lambda tc: tc[0])


class CounterHistory:
    """Per-port baselines, checkpoints and flaps, loaded once and saved after every run."""

    def __init__(self, state_dir: Path, rules: Mapping[str, CounterThreshold], flap_window_s: float) -> None:
        self._file = StateFile(state_dir / STATE_FILE_NAME, version=STATE_VERSION)
        self._state: dict[str, Any] | None = None
        self.rules = rules
        self.flap_window_s = flap_window_s

    def load(self, current_boot: str | None) -> dict[str, Any]:
        """The ports' entries: another boot keeps only the flaps; a file without ports starts afresh. An older
        format was migrated by the state file, a newer one is read for the keys this release knows."""
        if self._state is None:
            self._state = self._file.load()
        state = self._state
        ports = state.get("ports")
        if not isinstance(ports, dict):
            state = {"version": STATE_VERSION, "boot_id": current_boot, "ports": {}}
        elif state.get("boot_id") != current_boot:
            # Another boot: counters restarted from zero; flap history is still history.
            state = {
                "version": STATE_VERSION,
                "boot_id": current_boot,
                "ports": {
                    name: {"flaps": entry.get("flaps", [])} for name, entry in ports.items() if isinstance(entry, dict)
                },
            }
        self._state = state
        ports_now: dict[str, Any] = state["ports"]
        return ports_now

    def save(self, seen: set[str], now: float, boot: str | None) -> None:
        """Ports that vanished keep their flap history; their counter baselines would be stale."""
        assert self._state is not None
        ports: dict[str, Any] = self._state["ports"]
        for name, entry in list(ports.items()):
            if name not in seen and isinstance(entry, dict):
                flaps = self.recent_flaps(entry.get("flaps"), now)
                if flaps:
                    ports[name] = {"flaps": flaps}
                else:
                    del ports[name]
        self._state["boot_id"] = boot
        self._file.save(self._state)

    def recent_flaps(self, flaps: object, now: float) -> list[float]:
        if not isinstance(flaps, list):
            return []
        horizon = now - self.flap_window_s
        return [float(t) for t in flaps if isinstance(t, int | float) and horizon <= t <= now]

    def window(self, entry: Mapping[str, Any], counters: Mapping[str, int], now: float) -> PortWindow:
        """The port's deltas since its previous run (none on a first run or a clock that stood still)."""
        win = PortWindow(now, dict(counters), self.recent_flaps(entry.get("flaps"), now))
        raw_ts, raw_counters = entry.get("ts"), entry.get("counters")
        if isinstance(raw_ts, int | float) and isinstance(raw_counters, dict) and raw_ts < now:
            win.prev = (float(raw_ts), {k: v for k, v in raw_counters.items() if isinstance(v, int)})
        checkpoints = clean_checkpoints(entry.get("checkpoints"))
        if win.prev is None:
            # First run, or the clock stood still or went backwards: this reading is the new baseline;
            # checkpoints from the "future" mean nothing.
            win.checkpoints = [(t, c) for t, c in checkpoints if t < now]
            return win
        for name, value in counters.items():
            before = win.prev[1].get(name)
            if not isinstance(before, int):
                continue
            if value < before:
                # Reset (perfquery -R, driver reload, 32-bit wrap): new baseline for this counter.
                checkpoints = [(t, {k: v for k, v in c.items() if k != name}) for t, c in checkpoints]
                continue
            win.deltas[name] = value - before
        win.checkpoints = checkpoints
        downs = win.deltas.get("link_downed", 0)
        if downs > 0:
            win.flaps.extend([now] * min(downs, MAX_FLAPS_PER_RUN))
        return win

    def entry(self, win: PortWindow) -> dict[str, Any]:
        """The port's new state entry: this reading as the baseline, the checkpoint ring, the flaps."""
        checkpoints = self._add_checkpoint(win.checkpoints, win.now, win.counters)
        return {
            "ts": win.now,
            "counters": win.counters,
            "checkpoints": [[t, c] for t, c in checkpoints],
            "flaps": win.flaps,
        }

    def _history_counters(self) -> set[str]:
        """Counters whose rules look back further than one run (per minute / per hour)."""
        return {
            rule.counter or name
            for name, rule in self.rules.items()
            if rule.enabled and rule.kind == "rate" and PER_SECONDS[rule.per] > 1
        }

    def _add_checkpoint(self, checkpoints: Checkpoints, now: float, counters: Mapping[str, int]) -> Checkpoints:
        keep = self._history_counters()
        rates = [PER_SECONDS[r.per] for r in self.rules.values() if r.enabled and r.kind == "rate"]
        longest = max(rates, default=1.0)
        if not keep or longest <= 1:
            return []
        gap = longest / 60  # at most ~60 checkpoints per port
        horizon = now - longest - gap
        kept = [(t, c) for t, c in checkpoints if t >= horizon]
        if not kept or now - kept[-1][0] >= gap:
            kept.append((now, {k: v for k, v in counters.items() if k in keep}))
        return kept

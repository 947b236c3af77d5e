"""A systemd unit's state, as ``systemctl show -p LoadState,ActiveState,SubState,Result UNIT`` prints it.

Output (one ``Key=value`` line per property asked, in systemd's order; a unit that does not exist is
``LoadState=not-found``, ``ActiveState=inactive``)::

    LoadState=loaded
    ActiveState=failed
    SubState=failed
    Result=exit-code

``LoadState`` is asked beside the three states so that "not installed" and "installed but stopped" read apart.
The argv goes through the injected command runner (never a shell); tests stand recordings in.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.commands import CommandNotFound, CommandRunner, CommandTimeout

SHOW_PROPERTIES = "LoadState,ActiveState,SubState,Result"
SYSTEMCTL_TIMEOUT_S = 5.0
# systemd.unit(5): unit names are ASCII letters, digits, ":-_.\" and "@" for instances.
UNIT_NAME_RE = lazy_compile(r"^[A-Za-z0-9:_.@\\-]{1,255}$")
# ActiveState=active
PROPERTY_RE = lazy_compile(r"^(?P<key>[A-Za-z]{1,40})=(?P<value>.{0,200})$")


class UnitState(Struct, frozen=True):
    unit: str
    load_state: str | None
    active_state: str | None
    sub_state: str | None
    result: str | None

    @property
    def installed(self) -> bool:
        return self.load_state not in ("not-found", None)

    @property
    def active(self) -> bool:
        return self.active_state == "active"

    def describe(self) -> str:
        if not self.installed:
            return f"{self.unit} is not installed (LoadState={self.load_state})"
        result = f", Result={self.result}" if self.result and self.result != "success" else ""
        return f"{self.unit} is {self.active_state}/{self.sub_state}{result}"


def show_argv(unit: str) -> list[str]:
    if not UNIT_NAME_RE.match(unit):
        raise ValueError(f"not a systemd unit name: {unit[:80]!r}")
    return ["systemctl", "show", "-p", SHOW_PROPERTIES, unit]


def parse_systemctl_show(text: str, unit: str) -> UnitState:
    """The properties of ``systemctl show``; raises ValueError when it printed none of them."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        match = PROPERTY_RE.match(line.strip())
        if match is not None:
            props[match["key"]] = match["value"]
    if "ActiveState" not in props:
        raise ValueError(f"systemctl show printed no ActiveState for {unit}: {text.strip()[:120]!r}")
    return UnitState(unit, props.get("LoadState"), props["ActiveState"], props.get("SubState"), props.get("Result"))


def read_unit(run: CommandRunner, unit: str) -> UnitState | str:
    """The unit's state, or why it could not be read (no systemctl, systemd not running, a timeout)."""
    try:
        done = run(show_argv(unit), SYSTEMCTL_TIMEOUT_S)
    except CommandNotFound:
        return "systemctl not found"
    except CommandTimeout:
        return f"systemctl show {unit} timed out"
    if done.returncode != 0:
        return f"systemctl show {unit} exited {done.returncode}: {done.stderr.strip()[:160]}"
    try:
        return parse_systemctl_show(done.stdout, unit)
    except ValueError as exc:
        return str(exc)

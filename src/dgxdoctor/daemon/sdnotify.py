"""A tiny systemd notify client: datagrams to ``$NOTIFY_SOCKET`` (sd_notify(3)).

No libsystemd binding: the protocol is one ``KEY=VALUE`` datagram per message over a unix datagram socket.
A socket name starting with ``@`` is in the abstract namespace (the ``@`` becomes a NUL byte). Outside systemd
(no ``NOTIFY_SOCKET``) every call is a no-op, so the daemon runs the same by hand.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from dgxdoctor import eventlog

log = eventlog.get_logger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if raw.startswith("@"):
            self.address = b"\0" + raw[1:].encode()
        elif raw.startswith("/"):
            self.address = raw
        self.watchdog_s = _watchdog_interval(env)
        self._sock: socket.socket | None = None

    def notify(self, message: str) -> bool:
        """Send one message (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``, ``STATUS=...``); False if not sent."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                # Non-blocking: it is sent from the event loop, and a receiver that does not read (PID 1 busy, a
                # supervisor that only waits for READY=1) would otherwise stop the whole daemon, remediation included,
                # at the first full queue. A ping that does not fit is dropped: the next one comes.
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto(message.encode(), self.address)
        except OSError as exc:
            # systemd gone or the socket path wrong: log once per failure, never stop the daemon for it.
            log.warning("sd_notify_failed", message=message.split("=")[0], error=str(exc))
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of ``WATCHDOG_USEC`` (sd_watchdog_enabled(3)), or None.

    ``WATCHDOG_PID``, when set, names the process the watchdog is meant for; a child that inherited the
    variables must not ping for its parent.
    """
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 / 2 if value > 0 else None

"""WATCHDOG=1 is sent only while the scheduler's heartbeat is fresh; /healthz follows the same rule."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dgxdoctor import eventlog
from dgxdoctor.config import parse_config
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon


class RecordingNotifier(Notifier):
    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[str] = []

    def notify(self, message: str) -> bool:
        self.sent.append(message)
        return True


async def test_watchdog_withheld_when_the_scheduler_stalls(tmp_path: Path) -> None:
    config = parse_config({"paths": {"state_dir": str(tmp_path)}, "checks": {"peer_compare": {"enabled": False}}})
    notifier = RecordingNotifier()
    daemon = Daemon(config, None, notifier=notifier)
    now = [1000.0]
    daemon.scheduler.monotonic = lambda: now[0]
    daemon.scheduler.start()
    try:
        task = asyncio.create_task(daemon._watchdog(0.01))
        while "WATCHDOG=1" not in notifier.sent:
            await asyncio.sleep(0.01)
        assert daemon.health()["healthy"] is True

        now[0] += 3600  # the heartbeat job stops firing: an hour passes without it
        with eventlog.capture_logs() as logs:

            async def withheld(times: int) -> None:
                while sum(e["event"] == "watchdog_withheld" for e in logs) < times:
                    await asyncio.sleep(0.01)

            # A tick that saw the stale heartbeat logged it; from the next one on nothing may be sent.
            await asyncio.wait_for(withheld(1), 10)
            notifier.sent.clear()
            await asyncio.wait_for(withheld(4), 10)
        assert notifier.sent == []
        assert daemon.health()["healthy"] is False
        task.cancel()
    finally:
        daemon.scheduler.shutdown()

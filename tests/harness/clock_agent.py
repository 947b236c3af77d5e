"""``dgxdoctor run`` with its clock injected where the code takes one: the checks' ``Environment.clock`` (each
result's ``started_at``, the logs check's match times, the peer comparison's dating of a peer's result) and the
remediation engine's clock (holds, cooldowns, an action's end, an alert's start), both ``time.time()`` plus the
offset in ``$DGXDOCTOR_CLOCK_OFFSET_FILE`` (seconds; absent or unreadable: 0), read at every call, so a test steps
the agent's clock while it runs. The check scheduler keeps the real wall clock, as it does on a node.

Usage: ``python clock_agent.py CONFIG`` with ``tests`` and this checkout's ``src`` on PYTHONPATH
(``Node.start_daemon(program=...)``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from msgspec.structs import replace

from dgxdoctor.config import load_config
from dgxdoctor.daemon import logconfig
from dgxdoctor.daemon.service import Daemon


class SteppedClock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> float:
        try:
            offset = float(self.path.read_text() or 0.0)
        except (OSError, ValueError):
            offset = 0.0
        return time.time() + offset


def main(config_path: Path) -> None:
    config = load_config(config_path)
    logconfig.configure(config.daemon.log_level)
    daemon = Daemon(config, config_path)
    clock = SteppedClock(Path(os.environ.get("DGXDOCTOR_CLOCK_OFFSET_FILE", "/nonexistent")))
    daemon.env = replace(daemon.env, clock=clock)
    daemon.runner._env = daemon.env  # the runner dates each result with its environment's clock
    daemon.remediator.clock = clock
    daemon.remediator.intake.clock = clock
    loop = asyncio.new_event_loop()
    code = loop.run_until_complete(daemon.serve())
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

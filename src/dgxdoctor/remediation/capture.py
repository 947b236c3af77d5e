"""Capture before acting: a restart destroys the evidence of why it was needed (the engine's last log lines, the
kernel ring, ``ray status``, NCCL's state), so in act mode a bundle is taken first (NVSentinel does the same:
"remediation destroys the evidence").

The capture has a short deadline (``[bundle] capture_deadline_s``, a few seconds) and never delays the restart past
it: at the deadline the restart goes ahead and the archive, if still being written, is finished in the
background. Its path is named in the action's audit lines whatever happened, with how the capture ended. The last
``[bundle] keep`` captures stay in ``<state_dir>/bundles``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec import Struct

from dgxdoctor import eventlog
from dgxdoctor.compat import aio

log = eventlog.get_logger(__name__)

BUNDLES_DIR = "bundles"
# The collection is given the capture's deadline less this, to leave time to write the archive.
WRITE_MARGIN_S = 0.75

# (archive path, action, collection deadline in s) -> the bundle's top manifest; raises OSError when unwritable.
Writer = Callable[[Path, str, float], dict[str, Any]]


class CaptureSettings(Struct, frozen=True):
    enabled: bool
    deadline_s: float
    keep: int


class PreActionCapture:
    def __init__(
        self,
        writer: Writer,
        state_dir: Callable[[], Path],
        node: Callable[[], str],
        settings: Callable[[], CaptureSettings],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = writer
        self.state_dir = state_dir
        self.node = node
        self.settings = settings
        self.clock = clock
        self.pending: set[asyncio.Task[dict[str, Any]]] = set()

    def _write(self, path: Path, action: str, collect_s: float, keep: int) -> dict[str, Any]:
        top = self.writer(path, action, collect_s)
        from dgxdoctor.bundle.build import keep_last  # the bundle code loads at the first capture, not at start

        keep_last(path.parent, keep)
        return top

    def planned(self, action: str, action_id: str) -> Path | None:
        """Where the capture of this action will be written (None: captures are off), known before it starts so
        that the action's first audit line, written before anything runs, can name it."""
        if not self.settings().enabled:
            return None
        from dgxdoctor.bundle.build import bundle_name

        return self.state_dir() / BUNDLES_DIR / bundle_name(self.node(), self.clock(), f"{action}-{action_id}")

    async def before(self, action: str, action_id: str, path: Path | None = None) -> dict[str, Any]:
        """The audit fields naming the capture: ``bundle`` (its path), ``capture`` (how it ended), ``capture_s``.

        Never raises: whatever goes wrong with the evidence, the restart still runs."""
        try:
            return await self._capture(action, action_id, path or self.planned(action, action_id))
        except Exception as exc:
            log.error("capture_failed", action=action, error=f"{type(exc).__name__}: {exc}")
            return {"capture": f"failed: {type(exc).__name__}: {exc}"[:300]}

    async def _capture(self, action: str, action_id: str, path: Path | None) -> dict[str, Any]:
        s = self.settings()
        if not s.enabled or path is None:
            return {}
        t0 = time.monotonic()
        collect_s = max(s.deadline_s - WRITE_MARGIN_S, 0.25)
        task = asyncio.create_task(asyncio.to_thread(self._write, path, action, collect_s, s.keep))
        self.pending.add(task)
        task.add_done_callback(self._finished)
        try:
            top = await aio.wait_for(asyncio.shield(task), s.deadline_s)
        except TimeoutError:
            outcome = f"still writing at the {s.deadline_s:g} s deadline: the restart did not wait"
        except Exception as exc:  # an unwritable state_dir: the restart still runs, the audit says why
            outcome = f"failed: {type(exc).__name__}: {exc}"[:300]
        else:
            failed = len(top.get("failures", []))
            outcome = "complete" if not failed else f"complete, {failed} item(s) failed or missing (see its manifest)"
        seconds = round(time.monotonic() - t0, 3)
        log.info("capture_before_action", action=action, bundle=str(path), outcome=outcome, seconds=seconds)
        return {"bundle": str(path), "capture": outcome, "capture_s": seconds}

    def _finished(self, task: asyncio.Task[dict[str, Any]]) -> None:
        self.pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("capture_failed", error=f"{type(task.exception()).__name__}: {task.exception()}")

"""The one helper for following an event source in a daemon thread (the kernel log, NVML's XID events).

A thread, not a task on the event loop: the waits block (``poll()`` on /dev/kmsg, ``nvmlEventSetWait``) and NVML is
known to hang when a GPU falls off the bus, so they must never run on, nor block, the loop. Each wait is bounded,
so ``stop()`` is prompt. A failing wait is logged, kept in ``error`` for the check to report, and retried after
``RETRY_S``; a failing callback is logged and the thread goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from dgxdoctor import eventlog

log = eventlog.get_logger(__name__)

T = TypeVar("T")
RETRY_S = 5.0


class Follower(Generic[T]):
    """Calls ``wait()`` in a loop and hands each non-empty batch to ``callback``.

    ``wait`` blocks at most a short while and returns what arrived ([] for nothing). ``describe(exc)`` words a
    failure of ``wait`` for ``error``; ``event`` names the log line of a failure.
    """

    def __init__(
        self,
        name: str,
        wait: Callable[[], list[T]],
        callback: Callable[[list[T]], None],
        describe: Callable[[Exception], str],
        event: str,
    ) -> None:
        self.name = name
        self._wait = wait
        self.callback = callback
        self._describe = describe
        self._event = event
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def sleep(self, seconds: float) -> None:
        """Wait that long unless stopped meanwhile (for a ``wait`` that has nothing to block on)."""
        self._stop.wait(seconds)

    def interrupt(self) -> None:
        """Ends a ``wait`` blocked on something other than ``sleep`` (a subclass's descriptor) at ``stop``."""

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self.interrupt()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._wait()
            except Exception as exc:
                self.error = self._describe(exc)
                log.error(f"{self._event}_failed", follower=self.name, error=str(exc))
                self._stop.wait(RETRY_S)
                continue
            if batch:
                try:
                    self.callback(batch)
                except Exception as exc:
                    log.exception(f"{self._event}_callback_failed", error=str(exc))

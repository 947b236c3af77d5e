"""Out of the balancer's rotation while a restart drains and runs: remediation's hold on the readiness signal.

``hold("draining")`` before the drain, ``hold("restarting")`` once it is over, ``release()`` after the action; the
daemon's readiness (daemon/readiness.py) reads ``current`` and is told of every change (``on_change``), so
``/ready`` and HAProxy's agent answer at once. Set from the action's thread; read from the event loop.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from dgxdoctor import codes
from dgxdoctor.judge.readiness import Hold
from dgxdoctor.remediation.actions import DRAIN_OUTCOMES

# A problem whose engine cannot finish what it holds: no drain, the balancer's period only.
HUNG_CODES = frozenset({codes.ENGINE_HUNG, codes.VLLM_HUNG})
# vLLM is gone: nothing in flight, and the balancer's own check already sees the refused connection.
DEAD_CODES = frozenset({codes.VLLM_DEAD})


class Rotation:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Hold | None = None
        self.on_change: Callable[[], object] = lambda: None  # the readiness signal judges again
        self.ready: Callable[[], str] | None = None  # the readiness state now (None: no readiness signal)
        self.drains: Counter[str] = Counter(dict.fromkeys(DRAIN_OUTCOMES, 0))
        self.drain_s_total = 0.0
        self.last_drain_s: float | None = None

    def hold(self, state: Hold) -> None:
        with self._lock:
            self.current = state
        self.on_change()

    def release(self) -> None:
        with self._lock:
            was, self.current = self.current, None
        if was is not None:
            self.on_change()

    def drained(self, outcome: str, seconds: float) -> None:
        with self._lock:
            self.drains[outcome] += 1
            self.drain_s_total += seconds
            self.last_drain_s = seconds

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            return {"drains": dict(self.drains), "drain_s_total": self.drain_s_total,
                    "last_drain_s": self.last_drain_s}  # fmt: skip

"""The readiness signal a balancer uses: ``GET /ready`` (open, one word) and HAProxy's agent-check port.

``Readiness`` holds the published state: judge/readiness.py's verdict over the store's latest results and
remediation's hold, with hysteresis on the way back. Leaving rotation is at once; coming back takes
``ready_after_good`` good vllm check runs in a row, each begun after the last run judged bad (or after remediation
released its hold), so a result from before a restart never brings the node back. While out of rotation (and not
held), the vllm check is run at least every ``recheck_s`` so the node returns as soon as it is fit.

Evaluated on every result the store receives, when remediation holds or releases, and once a second.

HAProxy's agent-check protocol (``server ... agent-check agent-port PORT``): on each connection one line, then
close: ``up ready`` (``ready`` also cancels a drain or maintenance the agent set), ``drain #<reason>`` (suspect,
draining: no new requests, in-flight ones finish), ``maint #<reason>`` (a restart in progress), ``down #<reason>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from dgxdoctor import eventlog
from dgxdoctor.judge.readiness import STATES, Hold, State, Verdict, verdict
from dgxdoctor.result import CheckResult
from dgxdoctor.settings.readiness import ReadinessSettings

log = eventlog.get_logger(__name__)

TICK_S = 1.0
AGENT_WORDS: dict[State, str] = {
    "ready": "up ready",
    "suspect": "drain",
    "draining": "drain",
    "restarting": "maint",
    "down": "down",
}
REASON_CHARS = 120


class Readiness:
    def __init__(
        self,
        settings: Callable[[], ReadinessSettings],
        latest: Callable[[], dict[str, CheckResult]],
        hold: Callable[[], Hold | None],
        recheck: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.latest = latest
        self.hold = hold
        self.recheck = recheck
        self.clock = clock
        self._lock = threading.Lock()
        self.current = Verdict("down", "starting: no vllm check result yet")
        self.good = 0  # good vllm runs counted since the last bad evaluation
        self.bad_mark = -math.inf  # runs that began at or before this do not count towards ready
        self.counted = -math.inf  # the last run counted
        self.left_at: float | None = None  # when the node last left rotation (None: in rotation, or never in)
        self.changes: dict[str, int] = dict.fromkeys(STATES, 0)
        self.recoveries = 0
        self.recover_s_total = 0.0
        self.last_recover_s: float | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def state(self) -> State:
        return self.current.state

    def evaluate(self) -> Verdict:
        """Judge now and publish, with the hysteresis on the way back; thread-safe."""
        s = self.settings()
        latest = self.latest()
        hold = self.hold()
        now = self.clock()
        seen = verdict(latest, hold, s.suspect_after_s)
        vllm = latest.get("vllm")
        with self._lock:
            if not seen.ready:
                self.good = 0
                run = vllm.started_at if vllm is not None and hold is None else now
                self.bad_mark = max(self.bad_mark, run)
                self._publish(seen, now)
            elif self.current.ready:
                self._publish(seen, now)
            else:
                assert vllm is not None  # a ready verdict needs a vllm result
                if vllm.started_at > self.bad_mark and vllm.started_at > self.counted:
                    self.good += 1
                    self.counted = vllm.started_at
                need = s.ready_after_good
                if self.good >= need:
                    self._publish(seen, now)
                else:
                    why = f"{self.current.reason.split(' (recovering')[0]} (recovering: {self.good} of {need} good)"
                    self.current = Verdict(self.current.state, why[:300])
            return self.current

    def _publish(self, new: Verdict, now: float) -> None:
        old = self.current
        self.current = new
        if old.state == new.state:
            return
        self.changes[new.state] += 1
        if new.ready:
            if self.left_at is not None:
                took = max(now - self.left_at, 0.0)
                self.recoveries += 1
                self.recover_s_total += took
                self.last_recover_s = took
            self.left_at = None
        elif old.ready:
            self.left_at = now
        log.info("readiness", state=new.state, was=old.state, reason=new.reason)

    def observe(self, result: CheckResult) -> None:
        """A store listener: a vllm result (or any, it may carry a cause) is judged at once."""
        self.evaluate()

    # -- the loop -------------------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                current = self.evaluate()
                if not current.ready and self.hold() is None:
                    vllm = self.latest().get("vllm")
                    ended = vllm.started_at + vllm.duration_s if vllm is not None else -math.inf
                    if self.clock() - ended >= self.settings().recheck_s:
                        self.recheck()
            except Exception as exc:  # never stops the daemon: the state stays as last published
                log.error("readiness_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    # -- what a balancer reads ------------------------------------------------------------------------

    def agent_line(self) -> str:
        """HAProxy's agent-check answer: the words for the state, and the reason after ``#`` (printable ASCII)."""
        v = self.current
        if v.ready:
            return AGENT_WORDS["ready"] + "\n"
        reason = "".join(c if 32 <= ord(c) < 127 else " " for c in f"{v.state}: {v.reason}")[:REASON_CHARS]
        return f"{AGENT_WORDS[v.state]} #{reason}\n"

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self.current.state,
                "changes": dict(self.changes),
                "recoveries": self.recoveries,
                "recover_s_total": self.recover_s_total,
                "last_recover_s": self.last_recover_s,
            }


async def ready_handler(readiness: Readiness, request: web.Request) -> web.Response:
    """``GET /ready``: 200 ``ready`` or 503 with the state's one word; no token, no detail."""
    state = readiness.state
    return web.Response(
        text=state + "\n", status=200 if state == "ready" else 503, headers={"Cache-Control": "no-store"}
    )


def add_routes(app: web.Application, readiness: Readiness) -> None:
    async def handler(request: web.Request) -> web.Response:
        return await ready_handler(readiness, request)

    app.router.add_get("/ready", handler)


class AgentServer:
    """HAProxy's agent-check: a TCP listener answering each connection with one line, then closing it."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self.server: asyncio.AbstractServer | None = None
        self.address: tuple[str, int] | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._answer, host, port)
        sock = self.server.sockets[0].getsockname()
        self.address = (str(sock[0]), int(sock[1]))
        log.info("agent_check_serving", listen=f"{host}:{self.address[1]}")

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(self.readiness.agent_line().encode("ascii"))
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

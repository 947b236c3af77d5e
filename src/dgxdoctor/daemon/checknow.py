"""The peer's side of ``dgxdoctor check --cluster``: ``POST /check/run`` runs this node's checks now.

Token-authenticated (``app.auth_middleware``) and bounded: one run at a time (a second request while one runs is
409), at most one run per ``daemon.check_run_min_interval_s`` (429 with ``Retry-After``), every check under the
runner's timeout and never past the deadline the asker sends (its own deadline for the whole cluster run). The
runner is kept between requests, so a check whose last run hung is reported as hung instead of started again. The
body is untrusted: only ``{"deadline_s": N}`` is accepted; which checks run is this node's own configuration.

By hand: ``curl -X POST -H "Authorization: Bearer $TOKEN" -d '{"deadline_s": 30}' http://dgx-b:9835/check/run``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

from aiohttp import web
from msgspec import Meta, Struct

from dgxdoctor import eventlog
from dgxdoctor.checks.base import Check, CheckFactory, CheckRunner, capped
from dgxdoctor.config import Config
from dgxdoctor.daemon.gated import RunGate, json_body
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment

log = eventlog.get_logger(__name__)

MAX_DEADLINE_S = 600.0
# Checks that only make sense inside the daemon's own schedule or that the asker does itself.
NOT_RUN = frozenset({"peer_compare"})


def build_now(config: Config, factories: tuple[CheckFactory, ...], limit_s: float) -> list[Check]:
    """Fresh one-shot instances of the enabled checks (as ``dgxdoctor check`` would build them here)."""
    env = config.environment()
    out: list[Check] = []
    for factory in factories:
        settings = config.check_settings(factory.name)
        if settings.enabled and factory.name not in NOT_RUN:
            out.append(factory(capped(settings, limit_s), env))
    return out


class CheckRunBody(Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /check/run``'s body: ``{"deadline_s": N}`` or nothing."""

    deadline_s: Annotated[float, Meta(gt=0, le=MAX_DEADLINE_S)] = MAX_DEADLINE_S


def parse_deadline(raw: bytes) -> float:
    """``{"deadline_s": N}`` with 0 < N <= MAX_DEADLINE_S; ValueError saying what is wrong."""
    return json_body(raw, CheckRunBody).deadline_s


class CheckNow:
    """``build(deadline_s)`` gives the checks to run (``build_now`` in the daemon), ``env()`` the one-shot seams."""

    def __init__(
        self,
        build: Callable[[float], list[Check]],
        env: Callable[[], Environment],
        interval: Callable[[], float],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.build = build
        self.env = env
        self.clock = clock
        self.monotonic = monotonic
        self.gate = RunGate("check run", interval, monotonic)
        self.runner: CheckRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        return await self.gate.serve(request, parse_deadline, self._answer)

    async def _answer(self, deadline_s: float) -> web.Response:
        doc = await self.run(deadline_s)
        return web.json_response({"node": doc["node"], "results": doc})

    async def run(self, deadline_s: float) -> dict[str, Any]:
        env = self.env()
        if self.runner is None:
            self.runner = CheckRunner(env)
        checks = self.build(deadline_s)
        t0 = self.monotonic()
        results = await self.runner.run_once(checks)
        log.info("check_run_for_peer", checks=len(results), seconds=round(self.monotonic() - t0, 3))
        return ResultsDocument.of(env.node, results, self.clock(), env.group).state()


def add_routes(app: web.Application, service: CheckNow) -> None:
    app.router.add_post("/check/run", service.handle)

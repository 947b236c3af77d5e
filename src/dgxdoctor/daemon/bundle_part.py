"""The peer's side of ``dgxdoctor bundle --cluster`` and of the capture before a cluster restart:
``POST /bundle/part`` collects this node's part and answers it as a tar.gz.

Token-authenticated (``app.auth_middleware``) and bounded like ``POST /check/run`` (both by ``daemon/gated.py``):
one collection at a time, at most one per ``daemon.check_run_min_interval_s``, never past the deadline the asker
sends nor this node's own ``[bundle] deadline_s``; the size cap is this node's. The body is untrusted:
``{"since_s": N, "deadline_s": N}``.

By hand: ``curl -X POST -H "Authorization: Bearer $TOKEN" -d '{"since_s": 900}' http://dgx-b:9835/bundle/part
-o part.tar.gz``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from aiohttp import web
from msgspec import Meta, Struct

from dgxdoctor.config import Config
from dgxdoctor.daemon.gated import RunGate, json_body
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.remediation.capture import CaptureSettings, PreActionCapture, Writer

if TYPE_CHECKING:
    from dgxdoctor.bundle.items import Sources

# The bundle code (collect, redact, tar) is imported by the request that needs it: an idle daemon never holds it.
MAX_SINCE_S = 30 * 86400.0


class BundlePartBody(Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /bundle/part``'s body: ``{"since_s": N, "deadline_s": N}``, either or none (this node's own
    ``[bundle]`` values)."""

    since_s: Annotated[float, Meta(gt=0, le=MAX_SINCE_S)] | None = None
    deadline_s: Annotated[float, Meta(gt=0, le=3600.0)] | None = None


def parse_request(raw: bytes, config: Config) -> tuple[float, float]:
    """(since_s, deadline_s) from ``{"since_s": N, "deadline_s": N}``; ValueError saying what is wrong. The
    deadline is never past this node's own ``[bundle] deadline_s``."""
    b = config.bundle
    asked = json_body(raw, BundlePartBody)
    since_s = b.since_s if asked.since_s is None else asked.since_s
    return since_s, b.deadline_s if asked.deadline_s is None else min(asked.deadline_s, b.deadline_s)


def daemon_sources(store: ResultStore, role: str | None, since_s: float, bug_report: bool) -> Sources:
    """The daemon's own view: its latest results (as ``check --json`` shows them) and its ``/state``."""
    from dgxdoctor.bundle.items import Sources
    from dgxdoctor.documents import ResultsDocument
    from dgxdoctor.validation import validate

    def results() -> dict[str, Any]:
        return validate(ResultsDocument, store.snapshot()).report(role)

    return Sources(results, store.snapshot, since_s, bug_report)


class BundlePart:
    def __init__(self, config: Callable[[], Config], env: Callable[[], Any], store: ResultStore) -> None:
        self.config = config
        self.env = env
        self.store = store
        self.gate = RunGate("bundle collection", lambda: config().daemon.check_run_min_interval_s)

    async def handle(self, request: web.Request) -> web.Response:
        config = self.config()
        return await self.gate.serve(request, lambda raw: parse_request(raw, config), partial(self._part, config))

    async def _part(self, config: Config, asked: tuple[float, float]) -> web.Response:
        since_s, deadline_s = asked
        from dgxdoctor.bundle.archive import part_bytes
        from dgxdoctor.bundle.build import local_part

        sources = daemon_sources(self.store, config.role, since_s, bug_report=False)
        part = await asyncio.to_thread(local_part, config, self.env(), sources, deadline_s)
        body = await asyncio.to_thread(part_bytes, part)
        return web.Response(body=body, content_type="application/gzip")


def add_routes(app: web.Application, service: BundlePart) -> None:
    app.router.add_post("/bundle/part", service.handle)


def capture_writer(
    config: Callable[[], Config], env: Callable[[], Any], store: ResultStore, workers: Callable[[], tuple[str, ...]]
) -> Writer:
    """The capture before a restart: this node's part from the daemon's own view and, for a cluster restart, the
    workers' parts over the API, written as one archive."""

    def write(path: Path, action: str, collect_s: float) -> dict[str, Any]:
        from dgxdoctor.bundle.build import gather_parts, write_parts

        c = config()
        since = c.bundle.capture_since_s
        sources = daemon_sources(store, c.role, since, bug_report=False)
        peers = () if action == "restart_vllm" else workers()
        t0 = time.monotonic()
        mine, theirs = asyncio.run(gather_parts(c, env(), sources, collect_s, peers))
        seconds = time.monotonic() - t0
        return write_parts(path, c.node, mine, theirs, collect_s, since, f"capture before {action}", seconds)[1]

    return write


def pre_action_capture(config: Callable[[], Config], env: Callable[[], Any], store: ResultStore,
                       workers: Callable[[], tuple[str, ...]]) -> PreActionCapture:  # fmt: skip
    def settings() -> CaptureSettings:
        b = config().bundle
        return CaptureSettings(b.capture_before_restart, b.capture_deadline_s, b.keep)

    writer = capture_writer(config, env, store, workers)
    return PreActionCapture(writer, lambda: config().paths.state_dir, lambda: config().node, settings)

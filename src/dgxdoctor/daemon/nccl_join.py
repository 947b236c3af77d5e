"""The peer's side of a cross-node NCCL probe: ``POST /nccl/join`` starts this node's ranks, ``GET
/nccl/join/<run_id>`` returns their output when done.

Both need the peer token (``daemon.access``), and are refused outright on a node with no peer token configured
(loopback or not: every local user reaches loopback). The request is untrusted input: every field is validated
against a strict model, and only this node's own configuration decides what runs (its serving Python, its NCCL env
file, its GPU count); the request chooses the rendezvous, the sizes (1 B .. 16G, min <= max), the pinned algorithm
and protocol and the rail, each checked against the same rules as the config. Nothing reaches a shell: the probe is
an argv list. This node's own guard decides as for its local probe: ``[checks.nccl] enabled``, its
``maintenance_windows`` and its serving guard (vLLM serving here refuses, unless this node's own ``force``; the
request cannot carry one). One probe runs at a time.

By hand: ``curl -H "Authorization: Bearer $TOKEN" http://dgx-b:9835/nccl/join/<run_id>``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta, Struct, field
from msgspec.structs import replace

from dgxdoctor import eventlog
from dgxdoctor.checks.nccl import HCA_RE, NCCL_CHOICE_RE, NcclCheck, NcclSettings, ProbeRun
from dgxdoctor.checks.nccl_run import DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, ProbeSize
from dgxdoctor.environment import Environment
from dgxdoctor.settings.base import Frozen
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.sysfs_ib import ports_by_device
from dgxdoctor.validation import Host, sizes_in_order, validate

log = eventlog.get_logger(__name__)

# Finished runs kept for the head to fetch; older ones are dropped.
KEEP_RUNS = 8


class JoinRequest(Frozen, frozen=True):
    """What the head may ask for: the same field types as ``NcclSettings`` (``validation``)."""

    run_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}\Z")]
    master_addr: Host
    master_port: Annotated[int, Meta(ge=1, le=65535)]
    nnodes: Annotated[int, Meta(ge=2, le=64)]
    node_rank: Annotated[int, Meta(ge=1, le=63)]
    join_timeout_s: Annotated[float, Meta(gt=0, le=600)]
    quick: bool = False
    min_bytes: ProbeSize = DEFAULT_MIN_BYTES
    max_bytes: ProbeSize = DEFAULT_MAX_BYTES
    algo: Annotated[str, Meta(pattern=NCCL_CHOICE_RE.pattern)] = "Ring"
    proto: Annotated[str, Meta(pattern=NCCL_CHOICE_RE.pattern)] = "Simple"
    rail: Annotated[str, Meta(pattern=HCA_RE.pattern)] | None = None

    def __post_init__(self) -> None:
        sizes_in_order(self.min_bytes, self.max_bytes)
        if self.node_rank >= self.nnodes:
            raise ValueError("node_rank must be below nnodes")


class Job(Struct):
    request: JoinRequest
    started: float
    result: ProbeRun | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def to_dict(self, has_ib: bool) -> dict[str, Any]:
        if not self.done.is_set():
            return {"run_id": self.request.run_id, "state": "running", "seconds": round(time.time() - self.started, 1)}
        run = self.result
        return {
            "run_id": self.request.run_id,
            "state": "done",
            "returncode": run.returncode if run else -1,
            "stdout": run.stdout if run else "",
            "stderr": (run.stderr if run else "") or (self.error or ""),
            "has_ib": has_ib,
        }


class Refused(Exception):
    """The probe cannot start here now; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NcclJoinService:
    """Runs at most one joined probe at a time, in a thread; keeps the last few results."""

    def __init__(self, settings: Callable[[], NcclSettings], env: Callable[[], Environment]) -> None:
        self._settings = settings
        self._env = env
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def parse(self, doc: Any) -> JoinRequest:
        try:
            return validate(JoinRequest, doc)
        except msgspec.ValidationError as exc:
            raise Refused(400, str(exc)) from None

    def start(self, request: JoinRequest) -> Job:
        env = self._env()
        own = self._settings()
        if not own.enabled:
            raise Refused(409, "refused: [checks.nccl] enabled = false on this node")
        settings = replace(
            own,
            quick=request.quick,
            min_bytes=request.min_bytes,
            max_bytes=request.max_bytes,
            algo=request.algo,
            proto=request.proto,
            master_addr=request.master_addr,
            master_port=request.master_port,
            join_timeout_s=request.join_timeout_s,
            peer=None,
            rails=[],
        )
        check = NcclCheck(settings, replace(env, one_shot=False))  # a join is the daemon's: its windows apply
        with self._lock:
            if any(not j.done.is_set() for j in self._jobs.values()):
                raise Refused(409, "a probe is already running on this node")
            if request.run_id in self._jobs:
                raise Refused(409, "this run_id was already used")
            why = check.refusal()  # this node's window and serving guard, as for its own probe in the daemon
            if why is not None:
                raise Refused(409, why if why.startswith("refused") else f"refused: {why}")
            argv = check.argv(request.rail, nnodes=request.nnodes, node_rank=request.node_rank)
            if argv is None:
                raise Refused(503, "no probe here: set checks.nccl.serving_python (torch) on this node")
            job = Job(request, time.time())
            self._jobs[request.run_id] = job
            while len(self._jobs) > KEEP_RUNS:
                self._jobs.pop(next(iter(self._jobs)))
        timeout = request.join_timeout_s + settings.timeout_s
        threading.Thread(target=self._run, args=(check, argv, job, timeout), name="nccl-join", daemon=True).start()
        log.info("nccl_join_started", run_id=request.run_id, master=f"{request.master_addr}:{request.master_port}")
        return job

    def _run(self, check: NcclCheck, argv: list[str], job: Job, timeout_s: float) -> None:
        try:
            job.result = check.run_local(argv, job.request.rail, timeout_s=timeout_s)
        except (CommandNotFound, CommandTimeout, OSError) as exc:
            job.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a failing probe must not take the daemon down
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.done.set()
            code = job.result.returncode if job.result else None
            log.info("nccl_join_done", run_id=job.request.run_id, returncode=code, error=job.error)

    def status(self, run_id: str) -> dict[str, Any] | None:
        job = self._jobs.get(run_id)
        if job is None:
            return None
        return job.to_dict(has_ib=bool(ports_by_device(self._env().sysfs_root, counters=False)))


# -- HTTP -----------------------------------------------------------------------------------------------

SERVICE_KEY = web.AppKey("dgxdoctor_nccl_join", NcclJoinService)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def post_join(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    try:
        doc = json.loads(await request.read())  # the body is capped by the app's client_max_size
    except (ValueError, RecursionError):
        return _error(400, "body must be a JSON object")
    try:
        job = await asyncio.to_thread(lambda: service.start(service.parse(doc)))
    except Refused as exc:
        return _error(exc.status, str(exc))
    return web.json_response({"run_id": job.request.run_id, "state": "running"}, status=202)


async def get_join(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    run_id = request.match_info["run_id"]
    found = await asyncio.to_thread(service.status, run_id)
    if found is None:
        return _error(404, "no such probe run on this node")
    return web.json_response(found)


def add_routes(app: web.Application, service: NcclJoinService) -> None:
    app[SERVICE_KEY] = service
    app.router.add_post("/nccl/join", post_join)
    app.router.add_get(r"/nccl/join/{run_id:[0-9a-f]{32}}", get_join)

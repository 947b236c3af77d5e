"""``dgxdoctor run``: wires the store, the scheduler, the HTTP app, systemd notify, signals and reloads.

SIGTERM/SIGINT stop cleanly (STOPPING=1, jobs and event sources stopped, the server closed, exit 0). SIGHUP (and
an authorised ``POST /reload``) reloads the config: a bad new config is logged with every problem and the old
one stays in force. Checks whose settings did not change keep their instance and so their history.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor import __version__, eventlog
from dgxdoctor.checks.base import Check, CheckFactory, CheckRunner
from dgxdoctor.checks.peer_compare import discovery_findings
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.config import Config, ConfigError, load_config, parse_listen
from dgxdoctor.daemon import bundle_part, checknow, connections, memory
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.daemon.bundle_part import BundlePart, pre_action_capture
from dgxdoctor.daemon.checknow import CheckNow
from dgxdoctor.daemon.page import StatusPage
from dgxdoctor.daemon.ratelog import LoopErrors, RequestLog
from dgxdoctor.daemon.readiness import AgentServer, Readiness
from dgxdoctor.daemon.readiness import add_routes as readiness_routes
from dgxdoctor.daemon.remediation import build_remediator
from dgxdoctor.daemon.scheduler import CheckScheduler
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.exporters import collector
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.exporters.incidents import IncidentCollector
from dgxdoctor.exporters.readiness import ReadinessCollector
from dgxdoctor.exporters.remediation import RemediationCollector
from dgxdoctor.exporters.textfile import write_textfile
from dgxdoctor.fleet.breaker import FleetReading, Member, members_from_states
from dgxdoctor.fleet.discovery import Membership, discover
from dgxdoctor.fleet.incidents import IncidentTracker
from dgxdoctor.fleet.peer_states import PeerStates
from dgxdoctor.fleet.prom_fleet import PromFleet
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.remediation.audit import AuditLog
from dgxdoctor.remediation.engine import Remediator
from dgxdoctor.result import Finding, Sample, overall_status
from dgxdoctor.sources.statefile import WRITE_ERRORS, note_file, write_failed

log = eventlog.get_logger(__name__)

TEXTFILE_JOB = "__textfile__"
# With [fleet] prometheus_url: the fleet as Prometheus sees it, asked at the peer comparison's interval
# (fleet.prom_fleet); remediation reads the last answer and never waits on Prometheus.
PROM_FLEET_JOB = "__prometheus_fleet__"
TEXTFILE_LABEL = "textfile"  # the file label of dgxdoctor_write_errors_total for the node_exporter textfile
# glibc mallopt(3) parameter M_ARENA_MAX (malloc.h) and the arenas the daemon keeps. Every check run is a thread of
# its own (base.CheckRunner), and glibc gives threads up to 8 arenas per core, each keeping freed memory resident:
# on a 2-core VM that was ~1.3 MiB of the daemon's RSS, more on a DGX's 224 CPUs. Python's own allocator serves the
# small objects; the arenas only see the larger buffers, for which two suffice.
M_ARENA_MAX = -8
MALLOC_ARENAS = 2
# SIGTERM to exit: the unit's TimeoutStopSec is 30 s; the orderly stop (HTTP server, scheduler, event sources) gets
# this long, then the process exits anyway (a stop() stuck in a hung driver call must not earn a SIGKILL).
STOP_DEADLINE_S = 10.0
# Spread the first runs over this many seconds so a start does not run every check in the same instant.
FIRST_RUN_SPREAD_S = 2.0


def config_changes(old: Config, new: Config, token_changed: bool) -> list[str]:
    """What a reload changed outside the checks, as dotted keys (``daemon.peers``; a token only by name)."""
    changed = ["daemon.token"] if token_changed else []
    for section in ("node", "paths", "daemon", "remediation", "readiness", "alerts", "fleet"):
        before, after = getattr(old.model, section, None), getattr(new.model, section, None)
        if before == after:
            continue
        if isinstance(before, Struct) and isinstance(after, Struct):
            changed += [
                f"{section}.{key}"
                for key in after.__struct_fields__
                if getattr(before, key, None) != getattr(after, key, None) and f"{section}.{key}" not in changed
            ]
        else:
            changed.append(section)
    return changed


class Daemon:
    def __init__(
        self,
        config: Config,
        config_path: Path | None,
        listen: str | None = None,
        factories: tuple[CheckFactory, ...] = ALL_CHECKS,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.listen_override = listen
        self.factories = factories
        self.notifier = notifier or Notifier()
        # Checks reach the store and the peers through this seam; it reads self.config at each call, so a reload's
        # peers and token apply without rebuilding a check.
        self.peer_states = PeerStates()  # the peer comparison's last fetch of every peer: the status page's peers
        self.membership = Membership()  # the peers discovered, each source's last answer kept (fleet.discovery)
        self.fleet = Fleet(
            local_state=self._local_state,
            peers=self._peers,
            wake=lambda name: self.scheduler.wake(name),
            record_peers=self.peer_states.record,
        )
        self.env: Environment = replace(config.environment(one_shot=False), fleet=self.fleet, token=self._token)
        self.store = ResultStore(self.env.node, group=self.env.group)
        self.runner = CheckRunner(self.env)
        self.scheduler = CheckScheduler(self.runner, self.store)
        self.registry = make_registry(self.store, lambda: self.runner.timeouts_total, self.own_samples)
        self.credentials = config.daemon.resolve_credentials()
        self.token = self.credentials.peer  # what this node sends its peers and signs steps with
        self.remediator: Remediator = build_remediator(config, self.token, self.store.latest)
        self.prom_fleet = PromFleet()  # with [fleet] prometheus_url: the fleet as Prometheus last answered
        self.remediator.fleet = self.fleet_members  # the fleet breaker's cluster view: the peers' or Prometheus's
        self.remediator.relayed = self.relayed_causes  # with Prometheus: the group peers' hardware causes
        self._wire_evidence(config)
        self._wire_readiness()
        self.registry.register(RemediationCollector(lambda: self.store.node, self.remediator.metrics))
        self.app_state = self._app_state(config)
        self.started_at = time.time()
        self.stopping = asyncio.Event()
        self.bound: tuple[str, int] | None = None
        # The address actually served: a reload may change [daemon] listen, which takes effect at the next start.
        self.serving_listen = listen or config.daemon.listen
        self.reload_ok = True
        self.config_loaded_at = time.time()
        self.guard = connections.Guard(connections.Limits(max_connections=config.daemon.max_connections))
        self.request_log = RequestLog()
        self.loop_errors = LoopErrors()
        self._tasks: list[asyncio.Task[Any]] = []
        self.textfile_written_at: float | None = None
        self._textfile_writing: float | None = None

    def _app_state(self, config: Config) -> AppState:
        """What the HTTP routes reach: the store, the metrics, the credentials, remediation's two entry points."""
        state = AppState(
            self.store,
            self.registry,
            self.health,
            self.credentials,
            self.reload,
            alerts=self.remediator.accept_alerts,
            step=self.remediator.run_step,
            restart=self.remediator.planned_restart,
            metrics_require_token=config.daemon.metrics_require_token,
            client_cert_required=config.daemon.tls_client_ca_file is not None,
        )
        state.extra_routes = self._routes
        state.page = StatusPage(self.store, lambda: self.config, self.peer_states, self.incidents)
        return state

    def _wire_evidence(self, config: Config) -> None:
        """The cluster side: the capture before a restart, the incident figures, the peer's check run."""
        self.remediator.capture = pre_action_capture(
            lambda: self.config, lambda: self.env, self.store, lambda: self.remediator.targets.workers
        )
        self.incidents = IncidentTracker(config.paths.state_dir, self._actions_between)
        self.store.listeners.append(self.incidents.observe)
        self.registry.register(IncidentCollector(lambda: self.store.node, self.incidents))
        self.check_now = CheckNow(
            lambda limit: checknow.build_now(self.config, self.factories, limit),
            lambda: self.config.environment(),
            lambda: self.config.daemon.check_run_min_interval_s,
        )

    def _wire_readiness(self) -> None:
        """/ready and the agent-check port: the checks' verdict and remediation's hold (daemon.readiness)."""
        self.readiness = Readiness(
            lambda: self.config.readiness,
            self.store.latest,
            lambda: self.remediator.rotation.current,
            recheck=lambda: self.scheduler.wake("vllm"),
        )
        self.store.listeners.append(self.readiness.observe)
        self.registry.register(ReadinessCollector(lambda: self.store.node, self.readiness.metrics))
        self._hook_rotation()
        self.agent = AgentServer(self.readiness)

    def _hook_rotation(self) -> None:
        """Remediation's hold reaches the readiness at once; its rejoin step waits on the readiness state."""
        rotation = self.remediator.rotation
        rotation.on_change = self.readiness.evaluate
        rotation.ready = lambda: self.readiness.state

    # -- checks ----------------------------------------------------------------------------------------

    def _wake(self, check: str) -> None:
        self.scheduler.wake(check)

    def _local_state(self, without: str) -> dict[str, Any]:
        return self.store.snapshot(exclude=(without,))

    def _actions_between(self, start: float, end: float) -> list[str]:
        """Remediation's actions audited within an incident (``fleet.incidents``)."""
        records = AuditLog(self.config.paths.state_dir).tail(500)
        return [
            f"{r.get('action')} {r.get('outcome')}"
            for r in records
            if r.get("event") == "action" and isinstance(r.get("ts"), int | float) and start <= r["ts"] <= end
        ]

    def _token(self) -> str | None:
        return self.token

    def fleet_members(self) -> list[Member] | FleetReading:
        """This node's latest results and every peer's last /state (fleet.breaker), for the fleet breaker; with
        Prometheus as the cluster view, the others as Prometheus last said (fleet.prom_fleet)."""
        latest = list(self.store.latest().values())
        status = overall_status(latest).value
        if self.config.fleet.prometheus_url is not None:
            return self.prom_fleet.reading(Member(self.store.node, self.config.group, status != "critical"))
        return members_from_states(self.store.node, self.config.group, status, self.peer_states.all())

    def relayed_causes(self) -> list[Finding]:
        """With Prometheus as the cluster view: the hardware causes among the critical findings of the other nodes
        of this node's serving group, judged as the mesh's peer_compare relays them (PEER_HARDWARE_FAULT); a
        peer not scraped now, or Prometheus silent, keeps its last ones. Without: none (peer_compare relays)."""
        if self.config.fleet.prometheus_url is None:
            return []
        from dgxdoctor.judge.hardware_cause import peer_cause_findings

        out: list[Finding] = []
        for peer, doc, kept in self.prom_fleet.group_peers():
            found = peer_cause_findings(doc, peer)
            out += [replace(f, evidence=kept) for f in found] if kept else found
        return out

    def _configure_prom_fleet(self) -> None:
        """Ask Prometheus for the fleet at the peer comparison's interval, the first time now."""
        fleet = self.config.fleet
        url = fleet.prometheus_url
        if url is None:
            self.scheduler.remove_job(PROM_FLEET_JOB)
            return
        timeout_s = fleet.prometheus_timeout_s

        def refresh() -> None:
            self.prom_fleet.refresh(lambda: self.env.async_http_client(timeout_s), url, fleet.job, timeout_s,
                                    self.store.node, self.config.group)  # fmt: skip

        interval = self.config.check_settings("peer_compare").interval_s
        self.scheduler.add_job(PROM_FLEET_JOB, refresh, interval, first_run_in_s=0.0)

    def _peers(self) -> Peers:
        """The peers now (called from the peer comparison's thread): discovered (``fleet.discovery``), unless
        Prometheus is the cluster view and no peer's /state is fetched."""
        config = self.config
        d, prometheus = config.daemon, config.fleet.prometheus_url
        if prometheus is not None:
            return Peers(d.peers, self.token, d.peer_timeout_s, prometheus)
        urls, seen = discover(self.membership, config.peer_sources(), config.own_agent(), self.env.http_client)
        return Peers(urls, self.token, d.peer_timeout_s, None, discovery_findings(seen))

    def _build(self, factory: CheckFactory) -> Check:
        return factory(self.config.check_settings(factory.name), self.env)

    def _schedule_all(self) -> None:
        enabled = [f for f in self.factories if self.config.check_settings(f.name).enabled]
        for i, factory in enumerate(enabled):
            offset = FIRST_RUN_SPREAD_S * i / max(len(enabled), 1)
            self.scheduler.add(self._build(factory), first_run_in_s=offset)
        log.info("checks_scheduled", checks={f.name: self.config.check_settings(f.name).interval_s for f in enabled})

    def _routes(self, app: web.Application) -> None:
        self._nccl_routes(app)
        checknow.add_routes(app, self.check_now)
        readiness_routes(app, self.readiness)
        bundle_part.add_routes(app, BundlePart(lambda: self.config, lambda: self.env, self.store))

    def _nccl_routes(self, app: web.Application) -> None:
        from dgxdoctor.checks.nccl import NcclSettings
        from dgxdoctor.daemon.nccl_join import NcclJoinService, add_routes

        def settings() -> NcclSettings:
            current = self.config.check_settings("nccl")
            assert isinstance(current, NcclSettings)
            return current

        add_routes(app, NcclJoinService(settings, lambda: self.env))

    # -- health ----------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        age = self.scheduler.heartbeat_age()
        return {
            "healthy": self.scheduler.healthy() and not self.stopping.is_set(),
            "scheduler_running": self.scheduler.running,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "checks": sorted(self.scheduler.checks),
            "uptime_s": round(time.time() - self.started_at, 1),
            "version": __version__,
            # Peers measure their clock offset from this (fleet.cluster.measure_clock), to line up timelines.
            "clock": round(time.time(), 6),
        }

    async def _watchdog(self, interval: float) -> None:
        """WATCHDOG=1 only while the loop turns (this task runs) and the scheduler's heartbeat is fresh."""
        while True:
            await asyncio.sleep(interval)
            if self.scheduler.healthy():
                self.notifier.notify("WATCHDOG=1")
            else:
                log.error("watchdog_withheld", heartbeat_age_s=self.scheduler.heartbeat_age())

    # -- textfile --------------------------------------------------------------------------------------

    def _configure_textfile(self) -> None:
        d = self.config.daemon
        if d.textfile_path is None:
            self.scheduler.remove_job(TEXTFILE_JOB)
            return
        path = d.textfile_path

        note_file(TEXTFILE_LABEL)

        def write() -> None:
            # The textfile carries the time it is written, so a site scraping node_exporter sees its age.
            self._textfile_writing = time.time()
            try:
                write_textfile(path, self.registry)
            except OSError as exc:
                write_failed(TEXTFILE_LABEL, path, exc)
            else:
                self.textfile_written_at = self._textfile_writing
            finally:
                self._textfile_writing = None

        self.scheduler.add_job(TEXTFILE_JOB, write, d.textfile_interval_s)

    def own_samples(self) -> list[Sample]:
        """The daemon's own metrics (``exporters.collector.DAEMON_METRICS``)."""
        g = self.guard
        out = [
            Sample(collector.CONFIG_RELOAD_OK, 1.0 if self.reload_ok else 0.0),
            Sample(collector.CONFIG_RELOAD_TIME, self.config_loaded_at),
            Sample(collector.HTTP_CONNECTIONS, float(len(g.conns))),
            Sample(collector.HTTP_MAX_CONNECTIONS, float(g.cap)),
            Sample(collector.HTTP_BAD_REQUESTS, float(self.request_log.bad_requests)),
        ]
        out += [Sample(collector.HTTP_CLOSED, float(n), {"reason": r}) for r, n in sorted(g.closed.items())]
        out += [
            Sample(collector.EVENT_LOOP_ERRORS, float(n), {"error": e})
            for e, n in sorted(self.loop_errors.total.items())
        ]
        out += [Sample(collector.WRITE_ERRORS, float(n), {"file": f}) for f, n in sorted(WRITE_ERRORS.items())]
        written = self._textfile_writing or self.textfile_written_at
        if written is not None:
            out.append(Sample(collector.TEXTFILE_WRITTEN, written))
        return out

    # -- reload ----------------------------------------------------------------------------------------

    async def reload(self) -> list[str]:
        """Load the config again; on any problem keep the old one and return the problems."""
        self.notifier.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            problems = self._reload()
        finally:
            self.notifier.notify("READY=1")
        self.reload_ok = not problems
        if not problems:
            self.config_loaded_at = time.time()
        return problems

    def _reload(self) -> list[str]:
        try:
            new = load_config(self.config_path)
            credentials = new.daemon.resolve_credentials()
        except ConfigError as exc:
            problems = [f"{path}: {reason}" for path, reason in exc.problems]
            log.error("config_reload_rejected", source=exc.source, problems=problems, kept="previous configuration")
            return problems
        except (OSError, ValueError) as exc:
            problem = f"daemon token file: {exc}"
            log.error("config_reload_rejected", problems=[problem], kept="previous configuration")
            return [problem]
        old = self.config
        changed = config_changes(old, new, token_changed=credentials != self.credentials)
        token = credentials.peer
        self.config = new
        self.credentials, self.token = credentials, token
        self.app_state.credentials = credentials
        self.app_state.metrics_require_token = new.daemon.metrics_require_token
        for warning in new.warnings():
            log.warning("config_warning", detail=warning)
        if _tls_files(new) != _tls_files(old):
            log.warning("tls_change_needs_restart", detail="the listener's TLS files apply at the next start")
        new_env = replace(new.environment(one_shot=False), fleet=self.fleet, token=self._token)
        env_changed = new_env.node != self.env.node or new_env.role != self.env.role or new.paths != old.paths
        if new.daemon.listen != self.serving_listen and self.listen_override is None:
            log.warning("listen_change_needs_restart", listen=new.daemon.listen, serving=self.serving_listen)
        if env_changed:
            self.env = new_env
            self.store.node = new_env.node
        for factory in self.factories:
            name = factory.name
            settings = new.check_settings(name)
            current = self.scheduler.checks.get(name)
            if not settings.enabled:
                if current is not None:
                    self.scheduler.remove(name)
                    changed.append(f"-{name}")
                continue
            if current is not None and current.settings == settings and not env_changed:
                continue
            self.scheduler.remove(name, forget=False)
            self.scheduler.add(self._build(factory))
            changed.append(f"~{name}" if current is not None else f"+{name}")
        self._configure_textfile()
        self._configure_prom_fleet()
        self.remediator.reconfigure(build_remediator(new, token, self.store.latest))
        log.info("config_reloaded", source=new.source, changed=changed)
        return []

    # -- run -------------------------------------------------------------------------------------------

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        limit_malloc_arenas()
        host, port = parse_listen(self.listen_override or self.config.daemon.listen)
        self._warn_at_start()
        try:
            tls = _server_tls(self.config)
        except OSError as exc:
            log.error("tls_failed", error=str(exc))
            return 1
        loop.set_exception_handler(self.loop_errors)
        self.scheduler.start()
        self._schedule_all()
        self.remediator.start()
        self.readiness.start()
        self._configure_textfile()
        self._configure_prom_fleet()
        app = make_app(self.app_state, outer=(self.guard.middleware,))
        runner = connections.make_runner(app, self.guard.limits, self.request_log)
        try:
            http = await connections.serve(runner, self.guard, host, port, tls)
        except OSError as exc:
            log.error("listen_failed", listen=f"{host}:{port}", error=str(exc))
            self.scheduler.shutdown()
            return 1
        self.bound = http.address
        await self._start_agent_check()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        self.notifier.notify(f"READY=1\nSTATUS=serving on {host}:{self.bound[1]}")
        log.info(
            "serving",
            listen=f"{host}:{self.bound[1]}",
            tls=tls is not None,
            node=self.env.node,
            version=__version__,
            max_connections=self.guard.cap,
        )
        if self.notifier.watchdog_s:
            self._tasks.append(asyncio.create_task(self._watchdog(self.notifier.watchdog_s)))
        self._tasks.append(asyncio.create_task(_release_memory()))
        await self.stopping.wait()
        self.notifier.notify("STOPPING=1")
        log.info("stopping")
        for task in self._tasks:
            task.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        self.scheduler.shutdown()
        await self.remediator.stop()
        await self.readiness.stop()
        await self.agent.stop()
        await http.stop()
        self.notifier.close()
        log.info("stopped")
        return 0

    async def _start_agent_check(self) -> None:
        """HAProxy's agent-check on ``[readiness] agent_listen``, where set."""
        agent_listen = self.config.readiness.agent_listen
        if agent_listen is not None:
            try:
                await self.agent.start(*parse_listen(agent_listen))
            except OSError as exc:  # the balancer reads down: said, never a crash of the health agent
                log.error("agent_check_listen_failed", listen=agent_listen, error=str(exc))

    def _warn_at_start(self) -> None:
        """The config's warnings, and the tokens not configured: their endpoints refuse everyone."""
        for warning in self.config.warnings():
            log.warning("config_warning", detail=warning)
        held = {"read": self.credentials.read or self.token, "alert": self.credentials.alert, "peer": self.token}
        missing = [name for name, token in held.items() if token is None]
        if missing:
            log.warning(
                "no_token",
                missing=missing,
                detail="the endpoints of these tokens refuse everyone, loopback included: set [daemon] "
                "read_token_file, alert_token_file, peer_token_file (docs/daemon.md, Credentials)",
            )

    def _on_stop(self, sig: signal.Signals) -> None:
        log.info("signal", signal=sig.name)
        if not self.stopping.is_set():
            timer = threading.Timer(STOP_DEADLINE_S, _stop_overdue)
            timer.daemon = True
            timer.start()
        self.stopping.set()

    def _on_hup(self) -> None:
        log.info("signal", signal="SIGHUP")
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)


async def _release_memory() -> None:
    await asyncio.sleep(memory.SETTLE_S)
    memory.release_freed_memory(freeze=True)
    while True:
        await asyncio.sleep(memory.TRIM_EVERY_S)
        memory.release_freed_memory(freeze=False)


def _stop_overdue() -> None:
    log.error("stop_overdue", detail=f"orderly stop took over {STOP_DEADLINE_S:g} s: exiting now")
    sys.stdout.flush()
    os._exit(1)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (what ``MALLOC_ARENA_MAX`` does), unless the environment already sets it.

    Returns whether the cap was applied; False off glibc (musl, macOS) or where ``MALLOC_ARENA_MAX`` is set.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(arenas)))


def _tls_files(config: Config) -> tuple[Path | None, ...]:
    d = config.daemon
    return (d.tls_cert_file, d.tls_key_file, d.tls_client_ca_file)


def _server_tls(config: Config) -> ssl.SSLContext | None:
    """The listener's TLS context, or None for plain HTTP (OSError when a file is bad)."""
    d = config.daemon
    if d.tls_cert_file is None or d.tls_key_file is None:
        return None
    from dgxdoctor.sources.tls import server_context

    return server_context(d.tls_cert_file, d.tls_key_file, d.tls_client_ca_file)

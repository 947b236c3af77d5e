"""Ray cluster under vLLM: nodes ALIVE, GPUs registered, what waits for resources, head ports.

By hand, on the head node::

    ray status                                   # nodes, "0.0/16.0 GPU", pending demands
    curl -s 'http://127.0.0.1:8265/api/v0/nodes?detail=1'   # state and state_message per node
    ss -lntp | grep -E '6379|8265'               # GCS and dashboard listening
and on a worker node: ``pgrep -a raylet``.

Roles: the head answers the dashboard API and owns the cluster verdict (nodes, GPUs, demands, its ports);
a worker only checks that its raylet runs. ``auto`` follows the node's declared role (``[node] role``); with none
declared it takes the head role when the dashboard answers on a loopback URL, the worker role when it is refused
but a raylet runs here, and skips when there is no Ray.
A dashboard URL that points at another machine gives the cluster verdict without the local port checks; when
that machine does not answer, it is a warning (head down or a firewall between), never "no Ray here".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from msgspec import Meta
from msgspec.structs import replace

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge import ray
from dgxdoctor.judge.ray import (
    DEFAULT_EXPECTED_GPUS,
    DEFAULT_EXPECTED_NODES,
    cluster_findings,
    cluster_summary,
)
from dgxdoctor.judge.vllm_mp import ray_not_required
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import HOUR_S
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.container import serving
from dgxdoctor.sources.procfs import ProcessInfo, listening_ports, processes_named, trusted_process
from dgxdoctor.sources.ray_api import (
    CLUSTER_STATUS_PATH,
    NODES_DETAIL_PATH,
    NODES_SUMMARY_PATH,
    VERSION_PATH,
    ClusterView,
    RayApiError,
    RayNode,
    cluster_view,
    parse_cluster_status,
    parse_nodes_detail,
    parse_nodes_summary,
    parse_version,
)
from dgxdoctor.sources.ray_status import RayStatusError, parse_ray_status
from dgxdoctor.sources.vllm_launch import LaunchError, parse_launch, serving_process
from dgxdoctor.validation import HttpUrl

if TYPE_CHECKING:
    import httpx

NODES_ALIVE = MetricSpec("dgxdoctor_ray_nodes_alive", "Ray nodes in state ALIVE, as the head's GCS reports them")
NODES_DEAD = MetricSpec(
    "dgxdoctor_ray_nodes_dead", "Ray nodes in state DEAD since the head started (a rejoined node counts again)"
)
GPUS_TOTAL = MetricSpec("dgxdoctor_ray_gpus_total", "GPUs registered with Ray by the ALIVE nodes")
GPUS_USED = MetricSpec("dgxdoctor_ray_gpus_used", "GPUs held by Ray tasks, actors and placement groups")
PENDING_DEMANDS = MetricSpec(
    "dgxdoctor_ray_pending_demands", "Ray tasks/actors waiting for resources (lower bound: Ray reports 1+)"
)
PGS_PENDING = MetricSpec(
    "dgxdoctor_ray_placement_groups_pending", "Ray placement groups waiting for resources (lower bound)"
)
PORT_LISTENING = MetricSpec(
    "dgxdoctor_ray_port_listening",
    "1 if the Ray head port (GCS, dashboard) is listening on this node",
    labels=("port",),
)


class RaySettings(CheckSettings, frozen=True):
    dashboard_url: Annotated[
        HttpUrl, Meta(description="Ray dashboard of the head node (started with --dashboard-host)")
    ] = HttpUrl("http://127.0.0.1:8265")
    expected_nodes: Annotated[int, Meta(ge=1, le=4096, description="Ray nodes that must be ALIVE")] = (
        DEFAULT_EXPECTED_NODES
    )
    expected_gpus: Annotated[int, Meta(ge=0, le=65536, description="GPUs that Ray must see in the cluster")] = (
        DEFAULT_EXPECTED_GPUS
    )
    role: Annotated[
        Literal["auto", "head", "worker"],
        Meta(
            description="auto, head or worker. head: cluster verdict and GCS/dashboard ports; worker: raylet only; "
            "auto: the [node] role if declared, else head if the dashboard answers on a loopback URL, worker if it is "
            "refused and a raylet runs here"
        ),
    ] = "auto"
    gcs_port: Annotated[
        int, Meta(ge=1, le=65535, description="GCS port that must listen on the head (ray start --port)")
    ] = 6379
    dashboard_port: Annotated[int, Meta(ge=1, le=65535, description="dashboard port that must listen on the head")] = (
        8265
    )
    request_timeout_s: Annotated[float, Meta(gt=0, le=HOUR_S, description="timeout of each dashboard request")] = 5.0
    ray_command: Annotated[
        str,
        Meta(
            description="the ray CLI (name in PATH or full path): `ray status` when the head's dashboard is down; the "
            "example units in systemd/ run /opt/vllm/bin/ray, so set that path there (the service has no such PATH)"
        ),
    ] = "ray"
    auth_token_file: Annotated[
        Path | None,
        Meta(
            description="file with the cluster's token when Ray runs with RAY_AUTH_MODE=token (Ray keeps it in "
            "~/.ray/auth_token); sent as 'Authorization: Bearer'"
        ),
    ] = None


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Unreachable(Exception):
    pass


class _Unauthorized(Exception):
    pass


AUTH_REMEDY = (
    "the dashboard wants Ray's token (RAY_AUTH_MODE=token): set checks.ray.auth_token_file to a copy of the head's "
    "~/.ray/auth_token readable by dgxdoctor"
)


class RayCheck(Check[RaySettings]):
    """See the module docstring for roles and the commands that show the same by hand."""

    name: ClassVar[str] = "ray"
    probes: ClassVar[tuple[str, ...]] = ("dashboard", "ray status")

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self._timeouts: list[str] = []  # probes of the current run that timed out

    def run(self) -> CheckResult:
        self._timeouts = []
        result = self._run()
        return replace(result, timeouts=(*result.timeouts, *self._timeouts)) if self._timeouts else result

    def _run(self) -> CheckResult:
        s = self.settings
        not_required = self._not_required()
        if not_required is not None:
            return CheckResult.skipped(self.name, not_required)
        if self._role == "worker":
            return self._worker(configured=True)
        try:
            headers = self._auth_headers()
        except (OSError, UnicodeDecodeError) as exc:
            bad = ResultBuilder(self.name)
            bad.add(Finding("RAY_AUTH_TOKEN_UNREADABLE", Status.UNKNOWN, f"cannot read auth_token_file: {exc}"))
            return bad.build(f"Ray token unreadable: {exc}")
        refused = self.env.refusal(s.dashboard_url, s.request_timeout_s)
        if refused is not None:  # the client's words for it: "ConnectError: [Errno 111] Connection refused"
            return self._unreachable(f"ConnectError: {refused}")
        builder = ResultBuilder(self.name)
        with self.env.http_client(s.dashboard_url, s.request_timeout_s) as client:
            try:
                nodes = self._nodes(client, headers)
            except _Unreachable as exc:
                return self._unreachable(str(exc))
            except _Unauthorized as exc:
                builder.add(
                    Finding("RAY_API_UNAUTHORIZED", Status.UNKNOWN, str(exc), s.dashboard_url, remedy=AUTH_REMEDY)
                )
                if self._is_head():
                    self._ports(builder)
                return builder.build(f"Ray dashboard refused the request: {exc}")
            except RayApiError as exc:
                builder.add(Finding("RAY_API_ERROR", Status.UNKNOWN, str(exc), s.dashboard_url))
                return builder.build(f"Ray dashboard answered but its node list is unusable: {exc}")
            status = None
            try:
                status = parse_cluster_status(self._get(client, CLUSTER_STATUS_PATH, headers).content)
            except (_Unreachable, _Unauthorized, RayApiError) as exc:
                builder.add(
                    Finding(
                        "RAY_CLUSTER_STATUS_UNAVAILABLE",
                        Status.UNKNOWN,
                        f"no autoscaler report, pending demands unknown: {exc}",
                        s.dashboard_url,
                    )
                )
            try:
                version = parse_version(self._get(client, VERSION_PATH, headers).content)
            except (_Unreachable, _Unauthorized, RayApiError):
                version = None
        if version:
            builder.facts["ray_cluster_version"] = version
        view = cluster_view(nodes, status)
        builder.add(*cluster_findings(view, s.expected_nodes, s.expected_gpus))
        self._cluster_samples(builder, view, with_demands=status is not None)
        summary = cluster_summary(view, s.expected_nodes, s.expected_gpus)
        if self._is_head():
            self._ports(builder)
        else:
            summary += f" (head at {s.dashboard_url}; its ports are checked there)"
        return builder.build(summary)

    @staticmethod
    def _cluster_samples(builder: ResultBuilder, view: ClusterView, with_demands: bool) -> None:
        builder.sample(NODES_ALIVE, view.nodes_alive)
        # `ray status` text does not list dead nodes (Ray 2.60): their count is unknown there, not zero.
        builder.sample(NODES_DEAD, len(view.dead_nodes) if view.nodes else None)
        builder.sample(GPUS_TOTAL, view.gpus_total)
        builder.sample(GPUS_USED, view.gpus_used)
        if with_demands:
            builder.sample(PENDING_DEMANDS, sum(d.count for d in view.pending_tasks))
            builder.sample(PGS_PENDING, sum(d.count for d in view.pending_placement_groups))

    def _not_required(self) -> str | None:
        """vLLM's multiprocessing executor across nodes needs no Ray (judge/vllm_mp.py decides)."""
        if self.env.executor is not None:  # declared: the running processes are not asked
            return ray_not_required(self.env.executor, None)
        env = self.env
        members = serving(env.run_command, env.proc_root, env.container).pids if env.container is not None else None
        proc = serving_process(env.proc_root, env.serving_uid, members)
        try:
            launch = parse_launch(proc.pid, proc.cmdline) if proc is not None else None
        except LaunchError:
            launch = None
        return ray_not_required(self.env.executor, launch)

    @property
    def _role(self) -> str:
        """checks.ray.role, else the node's declared role ([node] role), else auto."""
        return self.settings.role if self.settings.role != "auto" else (self.env.role or "auto")

    def _is_head(self) -> bool:
        return self._role == "head" or is_loopback_url(self.settings.dashboard_url)

    def _auth_headers(self) -> dict[str, str]:
        if self.settings.auth_token_file is None:
            return {}
        token = self.settings.auth_token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise OSError(f"{self.settings.auth_token_file} is empty")
        return {"Authorization": f"Bearer {token}"}

    def _request(self, client: httpx.Client, path: str, headers: Mapping[str, str]) -> httpx.Response:
        import httpx

        try:
            response = client.get(path, headers=headers)
        except httpx.TimeoutException as exc:
            self._timeouts.append("dashboard")
            raise _Unreachable(f"timed out ({type(exc).__name__}: {exc})") from None
        except httpx.TransportError as exc:
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from None
        if response.status_code in (401, 403):
            sent = "a token" if headers else "no token"
            raise _Unauthorized(f"{path}: HTTP {response.status_code} {response.text[:80]!r} ({sent} sent)")
        return response

    def _get(self, client: httpx.Client, path: str, headers: Mapping[str, str]) -> httpx.Response:
        response = self._request(client, path, headers)
        if response.status_code != 200:
            raise RayApiError(f"{path}: HTTP {response.status_code} {response.text[:120]!r}")
        return response

    def _nodes(self, client: httpx.Client, headers: Mapping[str, str]) -> Sequence[RayNode]:
        response = self._request(client, NODES_DETAIL_PATH, headers)
        if response.status_code == 404:
            # Releases before the state API (Ray < 2.0) list nodes only in the dashboard's summary.
            return parse_nodes_summary(self._get(client, NODES_SUMMARY_PATH, headers).content)
        if response.status_code != 200:
            raise RayApiError(f"{NODES_DETAIL_PATH}: HTTP {response.status_code} {response.text[:120]!r}")
        return parse_nodes_detail(response.content)

    def _ports(self, builder: ResultBuilder) -> None:
        ports = listening_ports(self.env.proc_root)
        if ports is None:
            builder.add(
                Finding(
                    "RAY_PORTS_UNREADABLE",
                    Status.UNKNOWN,
                    f"cannot read {self.env.proc_root}/net/tcp: ports not checked",
                )
            )
            return
        for what, port in (("GCS", self.settings.gcs_port), ("dashboard", self.settings.dashboard_port)):
            listening = port in ports
            builder.sample(PORT_LISTENING, 1 if listening else 0, port=str(port))
            if not listening:
                builder.add(ray.port_not_listening(what, port))

    def _unreachable(self, error: str) -> CheckResult:
        s = self.settings
        procs, others = self._daemons("raylet", "gcs_server")
        gcs = [p for p in procs if p.comm == "gcs_server"]
        raylets = [p for p in procs if p.comm == "raylet"]
        if self._role == "auto" and not gcs:
            if not is_loopback_url(s.dashboard_url):
                # A head configured by address that does not answer: down, or a firewall in between (tutorial
                # error 5). Not "no Ray here": someone said where the head is.
                unreachable = ray.dashboard_unreachable(s.dashboard_url, error)
                return self._worker(configured=False, extra=unreachable, required=False)
            if raylets:
                return self._worker(configured=False)
            return CheckResult.skipped(
                self.name, f"no Ray here: dashboard {s.dashboard_url} not answering ({error}), no raylet or gcs_server"
            )
        builder = ResultBuilder(self.name)
        running = ", ".join(f"{p.comm} pid {p.pid}" for p in procs) or "no raylet or gcs_server process"
        running += _others_note(others)
        builder.add(ray.dashboard_down(s.dashboard_url, error, running))
        summary = f"head node: dashboard not answering; {running}"
        if gcs:
            view = self._ray_status(builder)
            if view is not None:
                builder.add(*cluster_findings(view, s.expected_nodes, s.expected_gpus))
                self._cluster_samples(builder, view, with_demands=True)
                summary += f"; ray status: {cluster_summary(view, s.expected_nodes, s.expected_gpus)}"
        self._ports(builder)
        return builder.build(summary)

    def _ray_status(self, builder: ResultBuilder) -> ClusterView | None:
        """The GCS still answers `ray status` when the dashboard is down: the cluster verdict from its text."""
        s = self.settings
        argv = [s.ray_command, "status", f"--address=127.0.0.1:{s.gcs_port}"]
        if s.auth_token_file is not None:
            argv = ["env", "RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={s.auth_token_file}", *argv]
        try:
            done = self.env.run_command(argv, timeout_s=max(1.0, s.timeout_s / 2))
        except CommandNotFound:
            builder.add(
                Finding(
                    "RAY_STATUS_UNAVAILABLE",
                    Status.UNKNOWN,
                    f"`{s.ray_command}` not found: nodes and GPUs unknown while the dashboard is down",
                    remedy="set checks.ray.ray_command to the ray executable of the Ray installation",
                )
            )
            return None
        except CommandTimeout as exc:
            builder.timed_out("ray status")
            builder.add(Finding("RAY_STATUS_UNAVAILABLE", Status.UNKNOWN, f"`ray status` timed out: {exc}"))
            return None
        try:
            if done.returncode != 0:
                raise RayStatusError(f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-200:]}")
            return parse_ray_status(done.stdout).view()
        except RayStatusError as exc:
            builder.add(Finding("RAY_STATUS_UNAVAILABLE", Status.UNKNOWN, f"`ray status` failed: {exc}"))
            return None

    def _worker(self, configured: bool, extra: Finding | None = None, required: bool = True) -> CheckResult:
        """A worker node: its raylet must run. ``required=False`` when it is unknown whether Ray belongs here."""
        builder = ResultBuilder(self.name)
        if extra is not None:
            builder.add(extra)
        raylets, others = self._daemons("raylet")
        note = _others_note(others)
        if raylets:
            pids = ", ".join(str(p.pid) for p in raylets)
            how = "" if configured else f" ({self.settings.dashboard_url} not answering here)"
            return builder.build(f"worker node: raylet running (pid {pids}){how}; cluster checks run on the head{note}")
        if not required:
            return builder.build(
                f"no raylet here and the head's dashboard {self.settings.dashboard_url} does not answer{note}"
            )
        builder.add(ray.raylet_down())
        return builder.build(f"worker node: no raylet running{note}")

    def _daemons(self, *names: str) -> tuple[list[ProcessInfo], int]:
        """Ray's daemons running here, of root, dgxdoctor's user or ``[node] serving_user``; and how many processes
        of the same name were left out: any user can run a program named ``raylet`` (its comm), and one would
        hide a raylet that died."""
        alive = [p for p in processes_named(self.env.proc_root, names) if p.alive]
        trusted = [p for p in alive if trusted_process(p.uid, serving_uid=self.env.serving_uid)]
        return trusted, len(alive) - len(trusted)


def _others_note(others: int) -> str:
    return f"; {others} process(es) of that name of another user ignored" if others else ""

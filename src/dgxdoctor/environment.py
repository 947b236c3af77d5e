"""The seams a check reads the world through. Tests inject these; nothing is monkeypatched."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from msgspec import Struct, field

from dgxdoctor.result import DEFAULT_GROUP, Finding
from dgxdoctor.sources.commands import (
    CommandRunner,
    HeadCommandRunner,
    LineCommandRunner,
    run_command,
    run_command_head,
    run_command_lines,
    run_command_merged,
)
from dgxdoctor.sources.container import Container

if TYPE_CHECKING:
    import httpx

    from dgxdoctor.sources.nvml import NvmlClient


# What a node is in the deployment (``[node] role``): the head runs the Ray head and vLLM's API server, a worker
# runs a raylet. None: not declared, so nothing is required and what is absent is SKIPPED.
Role = Literal["head", "worker"]
# How vLLM spans the nodes (``[node] executor``): "ray" (Ray executor: a raylet on every node), "mp" (vLLM's
# multiprocessing executor across nodes: ``--nnodes``, ``--headless`` on the workers, no Ray). None: read from the
# running vLLM's argv (sources/vllm_launch.py).
ExecutorKind = Literal["ray", "mp"]


def tcp_connect(host: str, port: int, timeout_s: float) -> None:
    """Open and close one TCP connection; raises OSError (refused, unreachable, timed out)."""
    with socket.create_connection((host, port), timeout=timeout_s):
        pass


def _default_nvml() -> NvmlClient:
    from dgxdoctor.sources.nvml import PynvmlClient

    return PynvmlClient()


@cache
def tls_context() -> ssl.SSLContext:
    """httpx's default certificate verification (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, else certifi), built once.

    httpx builds this for every new client: loading the CA bundle costs ~20 ms of CPU, a run of the vllm, ray and
    peer_compare checks each, which alone was half the daemon's idle CPU. The context is safe to share between
    threads.
    """
    import httpx

    return httpx.create_ssl_context()


@cache
def plain_context() -> ssl.SSLContext:
    """The context of a transport that only ever speaks plain HTTP: it verifies (certificate and host name required)
    but trusts no CA, so it could never accept a TLS peer, and building it loads nothing."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def __getattr__(name: str) -> Any:
    """``ByScheme`` and ``AsyncByScheme`` subclass httpx's transports: they are made at first use, so importing the
    seams loads no httpx (~60 ms of CPU at every `dgxdoctor check`, benchmarks/startup.py)."""
    if name in ("ByScheme", "AsyncByScheme"):
        return dict(zip(("ByScheme", "AsyncByScheme"), _transports(), strict=True))[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _transports() -> tuple[
    Callable[[ssl.SSLContext | None], httpx.BaseTransport], Callable[[ssl.SSLContext | None], httpx.AsyncBaseTransport]
]:
    import httpx

    class ByScheme(httpx.BaseTransport):
        """``http://`` through a transport that never loads the CA bundle; ``https://`` through one made at the first
        such request, with ``tls_context()``. The vllm and ray checks speak plain HTTP to loopback: a daemon that never
        speaks TLS never holds the parsed bundle (~1.5 MiB resident, benchmarks/README.md)."""

        def __init__(self, tls: ssl.SSLContext | None = None) -> None:
            self._plain = httpx.HTTPTransport(verify=plain_context())
            self._tls: httpx.HTTPTransport | None = None
            self._context = tls  # None: tls_context()

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.scheme != "https":
                return self._plain.handle_request(request)
            if self._tls is None:
                self._tls = httpx.HTTPTransport(verify=self._context or tls_context())
            return self._tls.handle_request(request)

        def close(self) -> None:
            self._plain.close()
            if self._tls is not None:
                self._tls.close()

    class AsyncByScheme(httpx.AsyncBaseTransport):
        """``ByScheme`` for an ``httpx.AsyncClient`` (the peer fetch)."""

        def __init__(self, tls: ssl.SSLContext | None = None) -> None:
            self._plain = httpx.AsyncHTTPTransport(verify=plain_context())
            self._tls: httpx.AsyncHTTPTransport | None = None
            self._context = tls

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.scheme != "https":
                return await self._plain.handle_async_request(request)
            if self._tls is None:
                self._tls = httpx.AsyncHTTPTransport(verify=self._context or tls_context())
            return await self._tls.handle_async_request(request)

        async def aclose(self) -> None:
            await self._plain.aclose()
            if self._tls is not None:
                await self._tls.aclose()

    return ByScheme, AsyncByScheme


def _no_token() -> str | None:
    return None


def _no_peer_tls() -> ssl.SSLContext | None:
    return None


class Peers(Struct, frozen=True):
    """The other nodes' dgxdoctor and how to ask them (the ``[daemon]`` table's peers, peer token, peer_timeout_s)."""

    urls: tuple[str, ...]
    token: str | None
    timeout_s: float
    # ``[fleet] prometheus_url``: the Prometheus that is the cluster view; set, the agents fetch no peer's /state.
    prometheus_url: str | None = None
    # What discovering the peers found this round (``fleet.discovery``: a source kept stale, a node that left Ray).
    findings: tuple[Finding, ...] = ()


class Fleet(Struct, frozen=True):
    """What the daemon knows beyond this node; ``Environment.fleet`` is None outside the daemon.

    ``local_state(check)`` is this node's ``/state`` document without that check's own result (the peer
    comparison leaves itself out, so it sees exactly what peers see of us). ``peers()`` is asked at every run, so
    a reload's new peers or token apply without rebuilding a check.
    """

    local_state: Callable[[str], dict[str, Any]]
    peers: Callable[[], Peers]
    # Run this check now (thread-safe): an event source calls it when it counted something, so the event reaches
    # /metrics and /state at once rather than at the check's next interval.
    wake: Callable[[str], None] = lambda name: None
    # The peer comparison hands over every peer's fetch (``fleet.peers.PeerFetch``) for the status page to show
    # (``fleet.peer_states``): the page asks no peer itself. Thread-safe.
    record_peers: Callable[[Sequence[Any]], None] = lambda fetched: None


class Environment(Struct, frozen=True):
    """Where the outside world is. Every path is a root so a test can lay out a copy of the real tree."""

    node: str = field(default_factory=socket.gethostname)
    group: str = DEFAULT_GROUP  # ``[node] group``: the serving group (result.DEFAULT_GROUP when unset)
    role: Role | None = None
    executor: ExecutorKind | None = None
    # The uid of ``[node] serving_user``: its processes are believed beside root's and the agent's own
    # (``procfs.trusted_uids``); None when unset.
    serving_uid: int | None = None
    # ``[node] container``: vLLM runs in this container (sources/container.py); None: on the host.
    container: Container | None = None
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    kmsg_path: Path = Path("/dev/kmsg")
    # Absolute paths written inside files the checks read (nccl.sh's ". /etc/nccl.env") are found under it.
    host_root: Path = Path("/")
    state_dir: Path = Path("/var/lib/dgxdoctor")
    nvml_factory: Callable[[], NvmlClient] = _default_nvml
    # None means a real network; tests pass an httpx.MockTransport only for peers that cannot run here.
    http_transport: httpx.BaseTransport | None = None
    # Every program the agent starts goes through these (sources/commands.py: argv, timeout, run in /).
    run_command: CommandRunner = run_command
    run_command_lines: LineCommandRunner = run_command_lines  # stderr line by line as it comes (probe progress)
    run_command_head: HeadCommandRunner = run_command_head  # the first N characters of stdout (journalctl)
    # The same with stderr in the one pipe (``docker logs``: the container's stdout and stderr, in order).
    run_command_merged: HeadCommandRunner = run_command_merged
    # A TCP connect with a deadline (the mp master's address from a worker); tests point it at loopback.
    connect: Callable[[str, int, float], None] = tcp_connect
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    # True for `dgxdoctor check` (one run, nothing before it); the daemon sets False. Checks that need two
    # readings (rates, forward progress) take both within one run when True, and use their previous run otherwise.
    one_shot: bool = True
    # The daemon's results store and peers (``fleet/``); None for the one-shot run.
    fleet: Fleet | None = None
    # The [daemon] table's shared secret, read when a check asks a peer's agent (the nccl cross-node probe); the
    # daemon's answers with the token in force after a reload. Raises OSError/ValueError for a bad token_file.
    token: Callable[[], str | None] = _no_token
    # How an https:// peer is verified and which client certificate it is shown (``[daemon] peer_ca_file``,
    # ``tls_cert_file``; ``sources.tls``); None: the default verification. Raises OSError for a bad file.
    peer_tls: Callable[[], ssl.SSLContext | None] = _no_peer_tls

    def refusal(self, url: str, timeout_s: float) -> str | None:
        """In the one-shot run: why nothing listens at a plain-HTTP ``url`` (``[Errno 111] Connection refused``),
        from one TCP connect and no HTTP library; None when something may answer (or the URL is https, a transport
        is injected, or this is the daemon, whose client is loaded anyway), and the HTTP client finds out. Nothing
        listening is a worker node's usual answer for vLLM's API server and the Ray dashboard, and
        `dgxdoctor check` then loads no HTTP client (~0.1 s, benchmarks/startup.py)."""
        if self.http_transport is not None or not self.one_shot:
            return None
        parts = urlsplit(url)
        try:
            port = parts.port or 80
        except ValueError:
            return None
        if parts.scheme != "http" or not parts.hostname:
            return None
        try:
            self.connect(parts.hostname, port, timeout_s)
        except ConnectionRefusedError as exc:
            return str(exc)
        except OSError:
            return None
        return None

    def http_client(self, base_url: str = "", timeout_s: float = 5.0, peer: bool = False) -> httpx.Client:
        """An httpx client whose responses are size-capped (``sources.http``); TLS context shared, and loaded only
        for an https URL (``ByScheme``). ``peer``: it talks to other nodes' agents (``peer_tls``)."""
        import httpx

        from dgxdoctor.sources.http import CappedTransport

        inner = self.http_transport or _transports()[0](self.peer_tls() if peer else None)
        return httpx.Client(base_url=base_url, timeout=timeout_s, transport=CappedTransport(inner))

    def async_http_client(self, timeout_s: float = 5.0, peer: bool = False) -> httpx.AsyncClient:
        """The same for asyncio (a transport injected for tests must also be an ``httpx.AsyncBaseTransport``)."""
        import httpx

        from dgxdoctor.sources.http import AsyncCappedTransport

        injected = self.http_transport
        if injected is not None and not isinstance(injected, httpx.AsyncBaseTransport):
            raise TypeError(f"{type(injected).__name__} cannot serve an async client")
        inner = injected if injected is not None else _transports()[1](self.peer_tls() if peer else None)
        return httpx.AsyncClient(timeout=timeout_s, transport=AsyncCappedTransport(inner))

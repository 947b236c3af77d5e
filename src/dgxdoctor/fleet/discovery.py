"""The peers, discovered: the static list (``[daemon] peers``) is one source among Ray's node table, Prometheus's
targets of the dgxdoctor job and a DNS name with several addresses (``[fleet] peer_sources``).

Two rules. A source that fails keeps its last known members: Ray's table fails exactly when Ray is the fault, and
that is when the peers matter most; the other sources still answer. And a node that leaves the Ray cluster is
a finding, not a silently shorter list: every node seen ALIVE stays a peer, UNKNOWN while it gives no state. What a
round saw (``Round``) is judged in judge/peers.py (``PEER_DISCOVERY_STALE``, ``PEER_LEFT_RAY``) by the peer
comparison.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from msgspec import Struct

from dgxdoctor.sources.peer_sources import TARGETS_PATH, agent_url, parse_prom_targets, resolve
from dgxdoctor.sources.ray_api import NODES_DETAIL_PATH, RayNode, parse_nodes_detail

if TYPE_CHECKING:
    import httpx

# In the order their members are listed: the operator's list first.
SOURCES = ("static", "ray", "prometheus", "dns")
# settings.daemon.MAX_PEERS: what one agent compares with (settings/ is a layer above).
MAX_PEERS = 64


class SourceAnswer(Struct, frozen=True):
    """What one source said: its members' agent URLs, or ``error`` (``urls`` None); Ray's rows with it."""

    source: str
    urls: tuple[str, ...] | None
    error: str | None = None
    ray: tuple[RayNode, ...] = ()


class Where(Struct, frozen=True):
    """How to reach the sources and the agents they name."""

    static: tuple[str, ...] = ()
    sources: tuple[str, ...] = ("static",)
    ray_dashboard: str | None = None
    ray_token_file: Path | None = None  # [checks.ray] auth_token_file: Ray's token (RAY_AUTH_MODE=token)
    prometheus_url: str | None = None
    job: str = "dgxdoctor"
    dns_name: str | None = None
    agent_port: int = 9835
    agent_scheme: str = "http"
    timeout_s: float = 2.0


def ask_sources(where: Where, client: httpx.Client) -> list[SourceAnswer]:
    """Each configured source, once, each bounded by ``where.timeout_s``; never raises."""
    out = []
    for source in SOURCES:
        if source not in where.sources:
            continue
        try:
            out.append(_ask(source, where, client))
        except Exception as exc:  # a failed source is its answer: kept, said, never a crash
            out.append(SourceAnswer(source, None, f"{type(exc).__name__}: {exc}"[:300]))
    return out


def _ask(source: str, where: Where, client: httpx.Client) -> SourceAnswer:
    if source == "static":
        return SourceAnswer(source, where.static)
    if source == "ray":
        token = where.ray_token_file.read_text(encoding="utf-8").strip() if where.ray_token_file else None
        headers = {"Authorization": f"Bearer {token}"} if token else None
        got = client.get(f"{where.ray_dashboard}{NODES_DETAIL_PATH}", headers=headers, timeout=where.timeout_s)
        got.raise_for_status()
        nodes = parse_nodes_detail(got.content)
        urls = tuple(agent_url(n.node_ip, where.agent_port, where.agent_scheme) for n in nodes if n.node_ip)
        return SourceAnswer(source, urls, ray=nodes)
    if source == "prometheus":
        got = client.get(f"{where.prometheus_url}{TARGETS_PATH}", timeout=where.timeout_s)
        got.raise_for_status()
        return SourceAnswer(source, parse_prom_targets(got.content, where.job))
    assert where.dns_name is not None
    addresses = resolve(where.dns_name, where.timeout_s)
    return SourceAnswer(source, tuple(agent_url(a, where.agent_port, where.agent_scheme) for a in addresses))


class Round(Struct, frozen=True):
    """What one round of discovery saw beyond the members (judged in judge/peers.py, by the peer comparison):
    the sources that failed, with their error and how many last known members were kept; the nodes Ray showed ALIVE
    that are now dead or gone (address, Ray's state and state message, None when gone from the table); and
    (found, cap) when more peers were found than are compared."""

    stale: tuple[tuple[str, str, int], ...] = ()
    left_ray: tuple[tuple[str, str | None, str | None], ...] = ()
    capped: tuple[int, int] | None = None


class Membership:
    """The members the sources gave, merged; each source's last good answer kept; every node Ray's table showed
    ALIVE remembered (by its IP: a node that rejoins gets a new node id, not a new address)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, ...]] = {}
        self._ray_seen: dict[str, str] = {}  # node IP -> its agent's URL

    def update(self, answers: Sequence[SourceAnswer], own: Callable[[str], bool]) -> tuple[tuple[str, ...], Round]:
        """(the peers' URLs, in source order, this node left out, at most MAX_PEERS; what this round saw)."""
        stale: list[tuple[str, str, int]] = []
        left: list[tuple[str, str | None, str | None]] = []
        for answer in answers:
            if answer.urls is None:
                stale.append((answer.source, answer.error or "", len(self._last.get(answer.source, ()))))
                continue
            urls = answer.urls
            if answer.source == "ray":
                urls, gone = self._ray(answer, own)
                left += gone
            self._last[answer.source] = urls
        merged = [u for s in SOURCES for u in self._last.get(s, ()) if not own(u)]
        peers = tuple(dict.fromkeys(merged))
        capped = (len(peers), MAX_PEERS) if len(peers) > MAX_PEERS else None
        return peers[:MAX_PEERS], Round(tuple(stale), tuple(left), capped)

    def _ray(
        self, answer: SourceAnswer, own: Callable[[str], bool]
    ) -> tuple[tuple[str, ...], list[tuple[str, str | None, str | None]]]:
        urls = dict(zip((n.node_ip for n in answer.ray if n.node_ip), answer.urls or (), strict=False))
        alive = {n.node_ip for n in answer.ray if n.alive and n.node_ip}
        for ip in sorted(alive):
            self._ray_seen[ip] = urls[ip]
        latest = {n.node_ip: n for n in answer.ray if n.node_ip and n.node_ip not in alive}
        left: list[tuple[str, str | None, str | None]] = []
        for ip, url in sorted(self._ray_seen.items()):
            if ip in alive or own(url):
                continue
            row = latest.get(ip)
            left.append((ip, row.state if row else None, row.state_message if row else None))
        return tuple(self._ray_seen.values()), left


def own_agent(listen_host: str, listen_port: int, names: Sequence[str] = ()) -> Callable[[str], bool]:
    """Whether a URL is this node's own agent: its port and one of this host's names or addresses."""
    hosts = {listen_host, "127.0.0.1", "::1", "localhost", socket.gethostname(), *names}
    with contextlib.suppress(OSError):
        hosts |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    hosts.discard("0.0.0.0")

    def own(url: str) -> bool:
        parts = urlsplit(url)
        return parts.port == listen_port and (parts.hostname or "") in hosts

    return own


def discover(
    membership: Membership, where: Where, own: Callable[[str], bool], client: Callable[[], httpx.Client]
) -> tuple[tuple[str, ...], Round]:
    """One round: ask the sources, merge with what ``membership`` remembers. Only the static list: no I/O."""
    if where.sources == ("static",):
        return membership.update([SourceAnswer("static", where.static)], own)
    with client() as http:
        return membership.update(ask_sources(where, http), own)

"""``[daemon]``: where ``dgxdoctor run`` listens, who may read its state, which peers it compares with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.fields import http_url
from dgxdoctor.sources.statefile import read_private_file
from dgxdoctor.validation import field_rule, record_rule

DEFAULT_PORT = 9835
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9835`` for IPv6) -> (host, port); ValueError naming what is wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    # isascii: str.isdigit() accepts "²", which int() refuses; the length keeps int() off huge digit runs
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536):
        raise ValueError(f"port must be 1-65535, got {port_text!r}")
    return host, int(port_text)


# Peers one agent compares with and asks during a cluster restart: the product is two nodes, a large deployment a few
# dozen; thousands would make every /state and comparison a fan-out the daemon was never sized for.
MAX_PEERS = 64


class DaemonSettings(Frozen, frozen=True):
    """``dgxdoctor run``: where it listens, who may read its state, which peers it compares with."""

    listen: Annotated[str, Meta(description="HOST:PORT of /metrics, /healthz and /state")] = DEFAULT_LISTEN
    token: Annotated[
        Annotated[str, Meta(min_length=16)] | None,
        Meta(description="shared secret peers send as 'Authorization: Bearer ...'; without it /state is loopback-only"),
    ] = None
    token_file: Annotated[
        Path | None,
        Meta(
            description="file holding the token (instead of token): a regular file, not a link, root's (or dgxdoctor's "
            "user's), mode 0600; anything else is a config error"
        ),
    ] = None
    peers: Annotated[
        tuple[str, ...],
        Meta(
            max_length=MAX_PEERS,
            description=f'dgxdoctor on the other nodes, e.g. ["http://dgx-b:9835"]; at most {MAX_PEERS}',
        ),
    ] = ()
    peer_timeout_s: Annotated[float, Meta(gt=0, le=60, description="seconds to wait for one peer's /state")] = 3.0
    textfile_path: Annotated[
        Path | None,
        Meta(description="also write the exposition here for node_exporter's textfile collector (a *.prom file)"),
    ] = None
    textfile_interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="seconds between textfile writes")] = 15.0
    max_connections: Annotated[
        int,
        Meta(
            ge=8,
            le=65536,
            description="client connections held at once (Prometheus, peers, curl); over it the longest-idle one is "
            "closed. Never more than the open-file limit leaves free for the checks",
        ),
    ] = 256
    log_level: Annotated[Literal["debug", "info", "warning", "error"], Meta(description="log level")] = "info"
    check_run_min_interval_s: Annotated[
        float,
        Meta(ge=0, le=3600, description="POST /check/run (a peer's `check --cluster`): at most one run per this long"),
    ] = 2.0
    page_refresh_s: Annotated[
        int,
        Meta(
            ge=0,
            le=3600,
            description="the status page (GET /) reloads itself in the browser every this many seconds, for a wall "
            "display (an HTML meta refresh: no script); 0: never",
        ),
    ] = 30

    @field_rule("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_rule("peers")
    @classmethod
    def _check_peers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        peers = tuple(http_url(peer, path=False) for peer in value)
        if len(set(peers)) != len(peers):
            raise ValueError("a peer is listed twice")
        return peers

    @record_rule
    def _one_token_source(self) -> DaemonSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set token or token_file, not both")
        return self

    def resolve_token(self) -> str | None:
        """The token itself, reading ``token_file`` if that is how it is given (OSError/ValueError if bad)."""
        if self.token_file is None:
            return self.token
        text = read_private_file(self.token_file).strip()
        if len(text) < 16:
            raise ValueError(f"{self.token_file}: token shorter than 16 characters")
        return text

"""``[daemon]``: where ``dgxdoctor run`` listens, who may read its state, which peers it compares with.

Three credentials, each from its own file, each opening only its endpoints (``daemon.app``): the read token
(``/``, ``/state``, ``/metrics`` when ``metrics_require_token``), the alert token (``/alertmanager``: what
Alertmanager holds opens nothing else) and the peer token (the endpoints that read secrets or act, and everything
the read token opens; the same on every node, since peers sign and authenticate with it). The old single ``token``
/ ``token_file`` still works as the peer token, and as the alert token unless ``alert_token_file`` is set, with a
warning (``deprecations``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta, Struct

from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.statefile import read_private_file
from dgxdoctor.validation import PeerUrl

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


MIN_TOKEN_CHARS = 16
# What a token file must hold: ``head -c 32 /dev/urandom | base64`` writes 44 characters.
TOKEN_FILE_RULE = (
    "a regular file, not a link, root's (or dgxdoctor's user's), mode 0600, holding at least "
    f"{MIN_TOKEN_CHARS} characters; anything else is a config error"
)


class Credentials(Struct, frozen=True):
    """The tokens in force (None: not configured, so what it opens refuses everyone)."""

    read: str | None = None
    alert: str | None = None
    peer: str | None = None


class DaemonSettings(Frozen, frozen=True):
    """``dgxdoctor run``: where it listens, who may read its state, which peers it compares with."""

    listen: Annotated[str, Meta(description="HOST:PORT of /metrics, /healthz and /state")] = DEFAULT_LISTEN
    read_token_file: Annotated[
        Path | None,
        Meta(description=f"file holding the read token (GET /, /state; /metrics with metrics_require_token): "
             f"{TOKEN_FILE_RULE}"),
    ] = None  # fmt: skip
    alert_token_file: Annotated[
        Path | None,
        Meta(description=f"file holding the alert token, the only one POST /alertmanager takes (Alertmanager's "
             f"credentials_file): {TOKEN_FILE_RULE}"),
    ] = None  # fmt: skip
    peer_token_file: Annotated[
        Path | None,
        Meta(description="file holding the peer/admin token, the same on every node: /bundle/part, /check/run, "
             "/reload, /remediation/step, /nccl/*, and what the read token opens; what this node sends its peers; "
             f"{TOKEN_FILE_RULE}"),
    ] = None  # fmt: skip
    token: Annotated[
        Annotated[str, Meta(min_length=MIN_TOKEN_CHARS)] | None,
        Meta(description="deprecated: the peer token written inline (and the alert token unless alert_token_file "
             "is set); use peer_token_file"),
    ] = None  # fmt: skip
    token_file: Annotated[
        Path | None,
        Meta(description="deprecated alias of peer_token_file (also the alert token unless alert_token_file is set)"),
    ] = None
    metrics_require_token: Annotated[
        bool, Meta(description="GET /metrics needs the read (or peer) token; off: open, as Prometheus expects")
    ] = False
    tls_cert_file: Annotated[
        Path | None,
        Meta(description="PEM certificate (chain) the listener serves TLS with; also this node's client "
             "certificate towards https:// peers. With tls_key_file"),
    ] = None  # fmt: skip
    tls_key_file: Annotated[Path | None, Meta(description="PEM private key of tls_cert_file (mode 0600)")] = None
    tls_client_ca_file: Annotated[
        Path | None,
        Meta(description="PEM CA(s) peers' client certificates must chain to: when set, the peer endpoints refuse "
             "a client without one (/metrics, /healthz and the read endpoints do not ask)"),
    ] = None  # fmt: skip
    peer_ca_file: Annotated[
        Path | None, Meta(description="PEM CA(s) that https:// peers' certificates are verified against")
    ] = None
    peers: Annotated[
        tuple[PeerUrl, ...],
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

    def __post_init__(self) -> None:
        """What spans fields, and the listen address (msgspec reports a ValueError here at ``$.daemon``)."""
        try:
            parse_listen(self.listen)
        except ValueError as exc:
            raise ValueError(f"listen: {exc}") from None
        if len(set(self.peers)) != len(self.peers):
            raise ValueError("peers: a peer is listed twice")
        given = [k for k in ("token", "token_file", "peer_token_file") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"set one of {' / '.join(given)} (the peer token), not several")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set tls_cert_file and tls_key_file together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file (client certificates are TLS)")

    def deprecations(self) -> list[str]:
        """Config warnings: keys that still work but should be migrated (docs/daemon.md "Credentials")."""
        out = []
        for key in ("token", "token_file"):
            if getattr(self, key) is not None:
                alert = "" if self.alert_token_file is not None else " and the alert token"
                out.append(
                    f"daemon.{key} is deprecated: it serves as the peer token{alert}; move it to peer_token_file and "
                    "give Alertmanager and the page their own alert_token_file and read_token_file"
                )
        return out

    def resolve_token(self) -> str | None:
        """The peer/admin token (what this node sends its peers and signs steps with), reading its file
        (OSError/ValueError if bad); None when not configured."""
        if self.peer_token_file is not None:
            return _read_token(self.peer_token_file)
        if self.token_file is not None:
            return _read_token(self.token_file)
        return self.token

    def resolve_credentials(self) -> Credentials:
        """Every token in force (OSError/ValueError naming the bad file). The deprecated single token is the peer
        token, and the alert token unless ``alert_token_file`` is set."""
        peer = self.resolve_token()
        legacy = peer if self.peer_token_file is None else None
        read = _read_token(self.read_token_file) if self.read_token_file is not None else None
        alert = _read_token(self.alert_token_file) if self.alert_token_file is not None else legacy
        return Credentials(read=read, alert=alert, peer=peer)


def _read_token(path: Path) -> str:
    text = read_private_file(path).strip()
    if len(text) < MIN_TOKEN_CHARS:
        raise ValueError(f"{path}: token shorter than {MIN_TOKEN_CHARS} characters")
    return text

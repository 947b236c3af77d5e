"""This node's own daemon's latest results (``GET /state`` on its local API with the read token): what
``slurm-health`` and ``conditions`` judge from. Never a probe: the daemon's checks ran already; this is a round
trip of a few milliseconds, held to one deadline from connect to last byte and validated like a peer's answer
(``fleet.peers.fetch_state``)."""

from __future__ import annotations

import asyncio

from dgxdoctor.config import Config, parse_listen
from dgxdoctor.documents import ResultsDocument

DEFAULT_TIMEOUT_S = 5.0


class DaemonUnavailable(Exception):
    """The local daemon did not answer usably (not running, no token, refused, too slow, a bad document)."""


def local_url(config: Config) -> str:
    """Where this node's daemon listens, as a client on the node reaches it: a wildcard listen is asked on loopback,
    or by the node's own name over TLS (the daemon's certificate names the node, not loopback)."""
    host, port = parse_listen(config.daemon.listen)
    tls = config.daemon.tls_cert_file is not None
    if host in ("0.0.0.0", "::", ""):
        host = config.node if tls else "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def read_token(config: Config) -> str | None:
    """The read token (least privilege), else the peer token, which opens /state too; None: none configured."""
    try:
        creds = config.daemon.resolve_credentials()
    except (OSError, ValueError) as exc:
        raise DaemonUnavailable(f"cannot read the daemon's token: {exc}") from None
    return creds.read or creds.peer


def local_state(config: Config, timeout_s: float = DEFAULT_TIMEOUT_S) -> ResultsDocument:
    """The daemon's latest results document; DaemonUnavailable saying why there is none."""
    from dgxdoctor.fleet.peers import fetch_state

    url = local_url(config)
    token = read_token(config)
    env = config.environment()

    async def ask() -> ResultsDocument:
        async with env.async_http_client(timeout_s, peer=True) as client:
            fetched = await fetch_state(client, url, token, timeout_s)
        if fetched.document is None:
            hint = "" if token is not None else " (no read_token_file or peer_token_file is configured)"
            raise DaemonUnavailable(f"the dgxdoctor daemon at {url} gave no results: {fetched.error}{hint}")
        return fetched.document

    loop = asyncio.new_event_loop()  # not asyncio.run: a helper thread stuck in a DNS lookup is not waited for
    try:
        return loop.run_until_complete(ask())
    finally:
        loop.close()

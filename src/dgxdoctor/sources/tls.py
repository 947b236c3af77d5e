"""The TLS contexts of the daemon's listener and of its requests to peers, from the ``[daemon]`` files.

The listener asks for a client certificate only when ``tls_client_ca_file`` is set, and then optionally
(``CERT_OPTIONAL``): a certificate offered is verified against that CA or the handshake fails, and the peer
endpoints refuse a connection that offered none (``daemon.app``). Prometheus and a load balancer keep reaching
``/metrics`` and ``/healthz`` without one. A peer request presents this node's own certificate, so one certificate
per node serves both ways (it needs both ``serverAuth`` and ``clientAuth`` where extended key usage is set).
"""

from __future__ import annotations

import ssl
from functools import cache
from pathlib import Path


def server_context(cert_file: Path, key_file: Path, client_ca_file: Path | None = None) -> ssl.SSLContext:
    """TLS 1.2 or later with the certificate and key; OSError (ssl.SSLError included) when a file is bad."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(client_ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def peer_client_context(ca_file: Path | None, cert_file: Path | None, key_file: Path | None) -> ssl.SSLContext | None:
    """What an https:// peer is verified with (``ca_file``; the system's CAs when None) and the client certificate
    presented to it; None when neither is configured (the default verification then). Built again only when a file
    changes (a renewed certificate applies at the next request). OSError when a file is bad."""
    if ca_file is None and cert_file is None:
        return None
    files = (ca_file, cert_file, key_file)
    stamps = tuple(None if f is None else f.stat().st_mtime_ns for f in files)
    return _client_context(files, stamps)


@cache
def _client_context(
    files: tuple[Path | None, Path | None, Path | None], stamps: tuple[int | None, ...]
) -> ssl.SSLContext:
    ca_file, cert_file, key_file = files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # certificate and host name required
    if ca_file is not None:
        ctx.load_verify_locations(cafile=str(ca_file))
    else:
        ctx.load_default_certs()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx

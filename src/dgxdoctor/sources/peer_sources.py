"""Where the other nodes' agents are, read from the engines that know the fleet: Prometheus's targets of the
dgxdoctor job, a DNS name with several addresses, Ray's node table (``sources.ray_api.parse_nodes_detail``). Thin
readers and pure parsers; ``fleet.discovery`` merges them and remembers.

By hand: ``curl -s PROMETHEUS/api/v1/targets?state=active | jq '.data.activeTargets[] | select(.labels.job ==
"dgxdoctor") | .scrapeUrl'``; ``getent ahosts dgx-fleet.example``; ``curl -s DASHBOARD/api/v0/nodes?detail=1``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

TARGETS_PATH = "/api/v1/targets?state=active"


class SourceError(ValueError):
    """A peer source answered, but not usably."""


def parse_prom_targets(payload: str | bytes, job: str) -> tuple[str, ...]:
    """Prometheus's ``/api/v1/targets`` -> the ``scheme://host:port`` of each active target of ``job``, sorted.

    Example target (Prometheus 2.42): ``{"labels": {"instance": "10.0.0.2:9835", "job": "dgxdoctor"},
    "scrapePool": "dgxdoctor", "scrapeUrl": "http://10.0.0.2:9835/metrics", "health": "up", ...}``."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise SourceError(f"targets: not JSON ({exc})") from None
    targets = doc.get("data", {}).get("activeTargets") if isinstance(doc, Mapping) else None
    if not isinstance(targets, list):
        raise SourceError("targets: no data.activeTargets")
    out = set()
    for target in targets:
        labels = target.get("labels") if isinstance(target, Mapping) else None
        if not isinstance(labels, Mapping) or labels.get("job") != job:
            continue
        url = urlsplit(str(target.get("scrapeUrl", "")))
        if url.scheme in ("http", "https") and url.netloc:
            out.add(f"{url.scheme}://{url.netloc}")
    return tuple(sorted(out))


def resolve(name: str, timeout_s: float) -> tuple[str, ...]:
    """Every address ``name`` resolves to (A and AAAA), sorted; OSError when it does not resolve. getaddrinfo has no
    timeout of its own: it runs on a daemon thread, given up (TimeoutError) after ``timeout_s``."""
    found: dict[str, Any] = {}

    def lookup() -> None:
        try:
            found["infos"] = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            found["error"] = exc

    thread = threading.Thread(target=lookup, name=f"resolve-{name}"[:15], daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{name}: no answer from the resolver within {timeout_s:g} s")
    if "error" in found:
        raise found["error"]
    return tuple(sorted({str(info[4][0]) for info in found["infos"]}))


def agent_url(address: str, port: int, scheme: str = "http") -> str:
    """``scheme://address:port``, an IPv6 address in brackets."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{scheme}://{host}:{port}"

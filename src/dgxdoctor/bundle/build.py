"""One bundle: this node's part collected here and, for a cluster bundle, every peer's part over the API at the
same time (``POST /bundle/part``), each peer's clock offset measured in the exchange, under one deadline."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from msgspec import Struct

from dgxdoctor.bundle.archive import BadPart, prune, read_part, write_bundle
from dgxdoctor.bundle.collect import Part, collect
from dgxdoctor.bundle.items import Sources, known_secrets, node_items
from dgxdoctor.bundle.redact import Redactor
from dgxdoctor.config import Config
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.cluster import HEALTHZ_PATH, measure_clock
from dgxdoctor.fleet.peers import BadAnswer, peer_label, read_answer, within

PART_PATH = "/bundle/part"
# A peer's part travels compressed; what it may hold uncompressed is bounded by the asker's size cap and this slack
# (its manifest).
PART_SLACK_BYTES = 2**20
PEER_MARGIN_S = 1.0


class PeerPart(Struct, frozen=True):
    url: str
    part: Part | None
    error: str | None
    seconds: float
    clock_offset_s: float | None = None
    rtt_s: float | None = None


def bundle_name(node: str, now: float, tag: str = "") -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"dgxdoctor-bundle-{safe(node)}-{stamp}{'-' + safe(tag) if tag else ''}.tar.gz"


def safe(text: str) -> str:
    """A name usable as one path component of the archive (a peer's node name is untrusted)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100].strip(".")
    return cleaned or "node"


def local_part(config: Config, env: Environment, sources: Sources, deadline_s: float) -> Part:
    redactor = Redactor(known_secrets(config))
    return collect(env.node, node_items(config, env, sources), deadline_s, config.bundle.size_cap_bytes, redactor)


async def ask_part(
    client: httpx.AsyncClient, url: str, token: str | None, since_s: float, budget_s: float, redactor: Redactor,
    max_bytes: int,
) -> PeerPart:  # fmt: skip
    """A peer's part within ``budget_s``; never raises. The part is redacted again here with our own secrets."""
    t0 = time.monotonic()
    body = {"since_s": since_s, "deadline_s": round(max(budget_s - PEER_MARGIN_S, 0.5), 3)}
    waiting = [f"GET {HEALTHZ_PATH} (its clock)"]

    async def exchange() -> tuple[float | None, float | None, Part]:
        offset, rtt = await measure_clock(client, url)
        waiting[0] = f"POST {PART_PATH}"
        raw = await read_answer(client, "POST", f"{url}{PART_PATH}", token, body, max_bytes + PART_SLACK_BYTES)
        return offset, rtt, read_part(raw, max_bytes + PART_SLACK_BYTES)

    try:  # the clock probe, the part and its reading all within the one budget
        offset, rtt, part = await within(exchange(), budget_s)
    except TimeoutError:
        return PeerPart(url, None, f"no answer to {waiting[0]} within the deadline ({budget_s:.1f} s)", _since(t0))
    except (httpx.HTTPError, BadAnswer, BadPart) as exc:
        return PeerPart(url, None, f"{type(exc).__name__}: {exc}"[:400], _since(t0))
    part.files = [(name, redactor.data(data)) for name, data in part.files]
    part.node = safe(part.node or peer_label(url))
    return PeerPart(url, part, None, _since(t0), offset, rtt)


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


async def gather_parts(config: Config, env: Environment, sources: Sources, deadline_s: float,
                       peers: Sequence[str]) -> tuple[Part, list[PeerPart]]:  # fmt: skip
    """This node's part (on worker threads) and every peer's, at the same time."""
    redactor = Redactor(known_secrets(config))
    try:
        token = config.daemon.resolve_token()
    except (OSError, ValueError):
        token = None  # a peer then refuses, and that is in the manifest
    mine = asyncio.create_task(asyncio.to_thread(local_part, config, env, sources, deadline_s))
    theirs: list[PeerPart] = []
    if peers:
        async with env.async_http_client(deadline_s, peer=True) as client:
            theirs = list(await asyncio.gather(*(
                ask_part(client, u, token, sources.since_s, deadline_s, redactor, config.bundle.size_cap_bytes)
                for u in peers
            )))  # fmt: skip
    return await mine, theirs


def top_manifest(command: str, node: str, mine: Part, theirs: Sequence[PeerPart], deadline_s: float,
                 since_s: float, seconds: float) -> dict[str, Any]:  # fmt: skip
    nodes: list[dict[str, Any]] = [
        {"node": mine.node, "local": True, "clock_offset_s": 0.0, "rtt_s": 0.0, "error": None,
         "bytes": mine.manifest.get("bytes"), "failures": len(mine.manifest.get("failures", []))}
    ]  # fmt: skip
    for p in theirs:
        m = p.part.manifest if p.part else {}
        name = p.part.node if p.part else safe(peer_label(p.url))
        nodes.append({"node": name, "url": p.url, "local": False, "clock_offset_s": p.clock_offset_s,
                      "rtt_s": p.rtt_s, "error": p.error, "seconds": p.seconds, "bytes": m.get("bytes"),
                      "failures": len(m.get("failures", []))})  # fmt: skip
    parts = [mine] + [p.part for p in theirs if p.part]
    return {
        "command": command,
        "created_by": node,
        "created_at": time.time(),
        "since_s": since_s,
        "deadline_s": deadline_s,
        "duration_s": round(seconds, 3),
        "nodes": nodes,
        "clock_note": "clock_offset_s is each node's clock minus the collecting node's (NTP's estimate from the "
        "exchange, good to half of rtt_s): subtract it from that node's timestamps to line them up",
        "limits_hit": {
            p.node: {k: v for k, v in p.manifest.get("limits", {}).items() if k.endswith("_hit") and v} for p in parts
        },
        "failures": [f"{n['node']}: {n['error']}" for n in nodes if n["error"]]
        + [f"{p.node}/{f['file']}: {f['status']} {f.get('error') or ''}".strip() for p in parts
           for f in p.manifest.get("failures", [])],
    }  # fmt: skip


def build_bundle(config: Config, env: Environment, sources: Sources, out: Path, deadline_s: float,
                 peers: Sequence[str], command: str) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    """Collect and write the archive; returns its path and the top manifest."""
    t0 = time.monotonic()
    mine, theirs = asyncio.run(gather_parts(config, env, sources, deadline_s, peers))
    return write_parts(out, env.node, mine, theirs, deadline_s, sources.since_s, command, time.monotonic() - t0)


def write_parts(out: Path, node: str, mine: Part, theirs: Sequence[PeerPart], deadline_s: float, since_s: float,
                command: str, seconds: float) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    mine.node = safe(mine.node)
    used = {mine.node}
    for p in theirs:
        if p.part is not None:
            if p.part.node in used:  # two nodes with one name: both kept, told apart by address
                p.part.node = safe(f"{p.part.node}@{peer_label(p.url)}")
            used.add(p.part.node)
    top = top_manifest(command, node, mine, theirs, deadline_s, since_s, seconds)
    write_bundle(out, [mine] + [p.part for p in theirs if p.part], top)
    return out, top


def keep_last(folder: Path, keep: int) -> None:
    prune(folder, keep, "dgxdoctor-bundle-*.tar.gz")

"""``dgxdoctor bundle``: this node's evidence (and with ``--cluster`` every peer's) in one ``.tar.gz``."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from dgxdoctor.bundle.build import build_bundle, bundle_name
from dgxdoctor.bundle.items import Sources
from dgxdoctor.checks.base import CheckRunner, capped
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.commands.local_daemon import local_url, read_token
from dgxdoctor.config import Config
from dgxdoctor.documents import ResultsDocument

# 90s, 15m, 2h, 1d, 1h30m (as journalctl --since and Prometheus durations spell them)
DURATION = re.compile(r"\A(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?\Z")


def parse_duration(text: str) -> float:
    """``1h30m`` -> 5400.0; ValueError naming the accepted forms."""
    match = DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r} (e.g. 900, 90s, 15m, 2h, 1d, 1h30m)")
    d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
    seconds = d * 86400 + h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ValueError("the duration must be more than 0 s")
    return seconds


def with_limits(config: Config, size_cap: int | None, deadline_s: float | None) -> Config:
    """The config with the command line's size cap and deadline in [bundle]."""
    update: dict[str, Any] = {}
    if size_cap is not None:
        update["size_cap_bytes"] = size_cap
    if deadline_s is not None:
        update["deadline_s"] = deadline_s
    if not update:
        return config
    bundle = replace(config.bundle, **update)
    return Config(replace(config.model, bundle=bundle), config.source)


def cli_sources(config: Config, since_s: float, deadline_s: float) -> Sources:
    """A fresh run of this node's checks (held to the deadline) and the local daemon's ``/state``."""
    env = config.environment()
    role = config.role

    def results() -> dict[str, Any]:
        limit = max(deadline_s - 2.0, 1.0)
        checks = [
            f(capped(config.check_settings(f.name), limit), env)
            for f in ALL_CHECKS
            if config.check_settings(f.name).enabled and f.name != "peer_compare"
        ]
        done = CheckRunner(env).run_once_blocking(checks)
        return ResultsDocument.of(env.node, done, time.time(), env.group).report(role)

    def state() -> dict[str, Any]:
        """The daemon's /state as it holds it (a bug report keeps every field), from where ``local_daemon`` says."""
        token = read_token(config)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with env.http_client(timeout_s=min(5.0, deadline_s), peer=True) as client:
            answer = client.get(f"{local_url(config)}/state", headers=headers)
        if answer.status_code != 200:
            raise OSError(f"the local daemon answered HTTP {answer.status_code}")
        doc: dict[str, Any] = answer.json()
        return doc

    return Sources(results, state, since_s, bug_report=True)


def run_bundle(config: Config, since_s: float | None, cluster: bool, out: Path | None) -> tuple[Path, dict[str, Any]]:
    since = since_s or config.bundle.since_s
    deadline = config.bundle.deadline_s
    env = config.environment()
    path = out or Path.cwd() / bundle_name(env.node, time.time(), "cluster" if cluster else "")
    peers = config.daemon.peers if cluster else ()
    command = f"dgxdoctor bundle --since {since:g}s{' --cluster' if cluster else ''}"
    return build_bundle(config, env, cli_sources(config, since, deadline), path, deadline, peers, command)

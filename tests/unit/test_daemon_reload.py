"""Reload keeps unchanged check instances (and their history), rebuilds changed ones, drops disabled ones, and
keeps the old config when the new one is bad."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from dgxdoctor.checks.peer_compare import PeerCompareCheck
from dgxdoctor.config import load_config
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon

TOKEN = "reload-token-0123456789"


def write(path: Path, extra: str = "", peers: str = '["http://dgx-b:9835"]') -> None:
    path.write_text(
        f'node = "dgx-a"\n[paths]\nstate_dir = "{path.parent / "state"}"\n'
        f'[daemon]\ntoken = "{TOKEN}"\npeers = {peers}\n{extra}'
    )


async def test_reload_semantics(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write(path)
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    daemon.scheduler.start()
    try:
        daemon._schedule_all()
        first = daemon.scheduler.checks["peer_compare"]
        assert isinstance(first, PeerCompareCheck) and first.env.fleet is not None
        assert first.env.fleet.peers().urls == ("http://dgx-b:9835",)

        write(path, peers='["http://dgx-b:9835", "http://dgx-c:9835"]')
        assert await daemon.reload() == []
        kept = daemon.scheduler.checks["peer_compare"]
        assert kept is first  # same settings: same instance, new peers handed over
        assert kept.env.fleet is not None and kept.env.fleet.peers().urls == ("http://dgx-b:9835", "http://dgx-c:9835")

        write(path, extra="[checks.peer_compare]\ninterval_s = 5\n")
        assert await daemon.reload() == []
        assert daemon.scheduler.checks["peer_compare"] is not first
        job = daemon.scheduler.aps.get_job("peer_compare")  # re-scheduled with the new interval
        assert job is not None and job.trigger.interval == timedelta(seconds=5) and job.max_instances == 1

        write(path, extra="[checks.peer_compare]\nenabled = false\n")
        assert await daemon.reload() == []
        assert "peer_compare" not in daemon.scheduler.checks
        assert not daemon.scheduler.has_job("peer_compare")

        before = daemon.config
        path.write_text('[daemon]\nlisten = "nowhere"\ntoken = "short"\n')
        assert await daemon.reload() == ["daemon: Expected `str` of length >= 16 - at `$.daemon.token`"]
        path.write_text('[daemon]\nlisten = "nowhere"\n')
        assert await daemon.reload() == ["daemon: listen: expected HOST:PORT, got 'nowhere' - at `$.daemon`"]
        assert daemon.config is before and daemon.app_state.credentials.peer == TOKEN
    finally:
        daemon.scheduler.shutdown()

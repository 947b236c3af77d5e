"""A reload can be seen: from Prometheus (as Prometheus and Alertmanager export theirs) and in its log line."""

from __future__ import annotations

from pathlib import Path

from dgxdoctor.config import load_config
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon
from dgxdoctor.eventlog import capture_logs
from dgxdoctor.exporters import collector


def write(path: Path, token: str = "reload-token-0123456789", listen: str = "127.0.0.1:9001") -> None:
    path.write_text(
        f'node = "dgx-a"\n[paths]\nstate_dir = "{path.parent / "state"}"\n'
        f'[daemon]\ntoken = "{token}"\nlisten = "{listen}"\n'
    )


def reload_samples(daemon: Daemon) -> tuple[float, float]:
    by_name = {s.metric.name: s.value for s in daemon.own_samples()}
    return by_name[collector.CONFIG_RELOAD_OK.name], by_name[collector.CONFIG_RELOAD_TIME.name]


async def test_rejected_and_accepted_reloads_are_exported(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write(path)
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    ok, loaded_at = reload_samples(daemon)
    assert ok == 1.0 and loaded_at > 0
    path.write_text("[daemon]\nlisten = 'nowhere'\n")
    assert await daemon.reload() != []
    assert reload_samples(daemon) == (0.0, loaded_at)
    write(path)
    assert await daemon.reload() == []
    ok, again = reload_samples(daemon)
    assert ok == 1.0 and again >= loaded_at


async def test_the_log_says_what_changed_token_included(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write(path)
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    write(path, token="another-token-0123456789")
    with capture_logs() as logs:
        assert await daemon.reload() == []
    (line,) = [entry for entry in logs if entry["event"] == "config_reloaded"]
    assert "daemon.token" in line["changed"]
    assert "another-token" not in repr(logs)


async def test_the_listen_warning_names_the_address_actually_served(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write(path, listen="127.0.0.1:9001")
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    with capture_logs() as logs:
        write(path, listen="127.0.0.1:9002")
        assert await daemon.reload() == []
        path.write_text("[daemon]\nlisten = 'nowhere'\n")
        assert await daemon.reload() != []
        write(path, listen="127.0.0.1:9003")
        assert await daemon.reload() == []
    warnings = [entry for entry in logs if entry["event"] == "listen_change_needs_restart"]
    assert [w["serving"] for w in warnings] == ["127.0.0.1:9001", "127.0.0.1:9001"]
    assert [w["listen"] for w in warnings] == ["127.0.0.1:9002", "127.0.0.1:9003"]

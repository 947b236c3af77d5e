"""The multi-node harness (tests/harness, docs/testing.md) lays a node out as the README and the shipped unit say:
its config starts from the README's install line and passes the daemon's own validation, the token file is the
README's, and the daemon's argv and environment are the unit's with the installed paths mapped into the node's
root. No namespaces needed: the integration tests start the nodes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dgxdoctor.config import load_config
from harness.deployment import Node, new_token, readme_config, unit_value
from harness.namespaces import NodeNamespaces


def node(tmp_path: Path, role: str | None = "head") -> Node:
    ns = NodeNamespaces("unused", "unused", "10.120.0.1", {})
    return Node("dgx-a", role, ns, tmp_path / "dgx-a", new_token(), ["http://dgx-b:9835"])


def test_the_config_is_the_readmes_and_validates(tmp_path: Path) -> None:
    assert readme_config() == {
        "node": {"name": "dgx-a", "role": "head"},
        "daemon": {
            "read_token_file": "/etc/dgxdoctor/read.token",
            "alert_token_file": "/etc/dgxdoctor/alert.token",
            "peer_token_file": "/etc/dgxdoctor/peer.token",
            "peers": ["http://dgx-b:9835"],
        },
        "checks.ray": {"ray_command": "/opt/vllm/bin/ray"},
    }
    n = node(tmp_path)
    n.configure(extra={"checks.vllm": {"interval_s": 1.0}}, only=("vllm",))
    config = load_config(n.config)  # the daemon's own validation, as `dgxdoctor run` loads it
    assert (config.node, config.role) == ("dgx-a", "head")
    assert config.daemon.peer_token_file == n.etc / "peer.token" and list(config.daemon.peers) == ["http://dgx-b:9835"]
    assert config.paths.state_dir == n.state and config.paths.kmsg_path == n.kmsg
    creds = config.daemon.resolve_credentials()
    assert creds.peer == n.token and None not in (creds.read, creds.alert) and config.warnings() == []
    for name in ("read", "alert", "peer"):
        assert stat.S_IMODE(os.stat(n.etc / f"{name}.token").st_mode) == 0o600


def test_no_role_leaves_the_readmes_role_out(tmp_path: Path) -> None:
    n = node(tmp_path, role=None)
    n.configure()
    assert load_config(n.config).role is None


def test_the_daemon_runs_as_the_unit_says(tmp_path: Path) -> None:
    n = node(tmp_path)
    argv = n.unit_argv()
    assert argv[-3:] == ["run", "--config", str(n.etc / "config.toml")]
    env = n.unit_env(tmp_path / "notify.sock")
    assert env["TMPDIR"] == str(n.runtime)  # Environment=TMPDIR=/run/dgxdoctor, the RuntimeDirectory
    assert env["WATCHDOG_USEC"] == str(int(unit_value("WatchdogSec")) * 1_000_000)
    assert env["PATH"].split(":")[0] == str(n.bin)  # the fake systemctl first
    assert (n.bin / "systemctl").exists()

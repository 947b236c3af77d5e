"""A real ``dgxdoctor run`` whose peers come from a DNS name: ``localhost`` gives its agent (another real daemon on
that port), and when the name stops resolving the last members are kept and the peer comparison says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemonproc import DaemonProc, free_port, running

pytestmark = pytest.mark.integration

TOKEN = "discovery-test-token-0123456789"


def config(name: str, work: Path, dns_name: str, agent_port: int) -> str:
    from dgxdoctor.checks.registry import ALL_CHECKS

    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name != "peer_compare")
    return (
        f'[node]\nname = "{name}"\n[paths]\nstate_dir = "{work / "state"}"\n'
        f'[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\npeer_timeout_s = 2.0\n'
        f'[fleet]\npeer_sources = ["dns"]\ndns_name = "{dns_name}"\nagent_port = {agent_port}\n'
        f"[checks.peer_compare]\ninterval_s = 1.0\n{quiet}"
    )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    b_port = free_port()
    b = DaemonProc(tmp_path / "b", config("dgx-b", tmp_path / "b", "localhost", 1), port=b_port, token=TOKEN)
    a = DaemonProc(tmp_path / "a", config("dgx-a", tmp_path / "a", "localhost", b_port), token=TOKEN)
    with running(a, b):
        yield a, b


def test_peers_from_a_dns_name_and_kept_when_it_fails(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    # localhost's addresses: 127.0.0.1, where dgx-b listens (and ::1 where /etc/hosts has it: no agent there)
    label = f"127.0.0.1:{b.port}"
    a.wait_for(lambda: a.metric("dgxdoctor_peer_up", peer=label) == 1.0, 30, "dgx-b found through DNS")
    # The name stops resolving: the config is reloaded with a name that does not exist.
    body = a.workdir.joinpath("config.toml").read_text().replace('"localhost"', '"no-such-host.invalid"')
    a.workdir.joinpath("config.toml").write_text(body)
    assert a.proc is not None
    a.proc.send_signal(1)  # SIGHUP: reload
    a.wait_for(lambda: "PEER_DISCOVERY_STALE" in {f["code"] for f in a.check("peer_compare")["findings"]}, 30, "stale")
    seen = a.check("peer_compare")
    assert a.metric("dgxdoctor_peer_up", peer=label) == 1.0, seen  # dgx-b kept, still compared
    stale = [f for f in seen["findings"] if f["code"] == "PEER_DISCOVERY_STALE"]
    assert stale[0]["subject"] == "dns" and "last known" in stale[0]["message"]

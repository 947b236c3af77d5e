from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.config import DEFAULT_LISTEN, ConfigError, load_config, parse_config, parse_listen


def problems(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return dict(info.value.problems)


def test_defaults() -> None:
    d = parse_config({}).daemon
    assert d.listen == DEFAULT_LISTEN == "0.0.0.0:9835"
    assert d.peers == () and d.token is None and d.resolve_token() is None and d.textfile_path is None


@pytest.mark.parametrize(
    ("daemon", "says"),
    [
        ({"listen": "9835"}, "listen: expected HOST:PORT, got '9835' - at `$.daemon`"),
        ({"peers": ["dgx-b:9835"]}, "'dgx-b:9835' is not an http(s)://HOST:PORT URL - at `$.daemon.peers[0]`"),
        ({"peers": ["http://b:1", "http://c:1/state"]}, "give only scheme, host and port - at `$.daemon.peers[1]`"),
        ({"token": "short"}, "Expected `str` of length >= 16 - at `$.daemon.token`"),
        ({"peer_timeout_s": 0}, "Expected `float` > 0.0 - at `$.daemon.peer_timeout_s`"),
        ({"colour": "blue"}, "Object contains unknown field `colour` - at `$.daemon`"),
    ],
)
def test_every_problem_reported_with_its_key(daemon: dict[str, object], says: str) -> None:
    (reason,) = problems({"daemon": daemon}).values()
    assert reason.endswith(says), reason


def test_token_or_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("abcdefghijklmnopqrstuvwxyz\n")
    token_file.chmod(0o600)  # as the README installs it: a token readable by others is refused
    assert (
        parse_config({"daemon": {"token_file": str(token_file)}}).daemon.resolve_token() == "abcdefghijklmnopqrstuvwxyz"
    )
    assert "not several" in str(problems({"daemon": {"token": "x" * 16, "token_file": str(token_file)}}))
    assert "not several" in str(problems({"daemon": {"token_file": str(token_file), "peer_token_file": "/p"}}))
    token_file.write_text("short")
    with pytest.raises(ValueError, match="shorter than 16"):
        parse_config({"daemon": {"token_file": str(token_file)}}).daemon.resolve_token()


def test_peers_normalised_and_duplicates_refused() -> None:
    assert parse_config({"daemon": {"peers": ["http://dgx-b:9835/"]}}).daemon.peers == ("http://dgx-b:9835",)
    assert problems({"daemon": {"peers": ["http://b:1/", "http://b:1"]}}) == {
        "daemon": "peers: a peer is listed twice - at `$.daemon`"
    }


def test_peer_compare_settings_live_with_the_check(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[checks.peer_compare]\ninterval_s = 5\ntolerances = { gpu_utilization = 0.3 }\n")
    assert load_config(path).check_settings("peer_compare").interval_s == 5


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.0.0.0:9835", ("0.0.0.0", 9835)), ("[::1]:80", ("::1", 80)), ("dgx-a:1", ("dgx-a", 1))],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", [":9835", "host", "host:0", "host:65536", "host:http"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(text)


def token_file(path: Path, value: str) -> str:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return str(path)


def test_three_credentials_and_the_deprecated_alias(tmp_path: Path) -> None:
    read, alert, peer = (token_file(tmp_path / n, f"{n}-token-0123456789abcdef") for n in ("read", "alert", "peer"))
    scoped = parse_config({"daemon": {"read_token_file": read, "alert_token_file": alert, "peer_token_file": peer}})
    creds = scoped.daemon.resolve_credentials()
    assert (creds.read, creds.alert, creds.peer) == tuple(
        f"{n}-token-0123456789abcdef" for n in ("read", "alert", "peer")
    )
    assert scoped.daemon.resolve_token() == creds.peer and scoped.warnings() == []
    # The peer token alone opens no webhook: the alert token is Alertmanager's.
    assert parse_config({"daemon": {"peer_token_file": peer}}).daemon.resolve_credentials().alert is None
    # The old single token: still the peer token, and the alert token unless one is given; with a warning.
    old = parse_config({"daemon": {"token_file": peer}})
    assert old.daemon.resolve_credentials() == type(creds)(read=None, alert=creds.peer, peer=creds.peer)
    assert "token_file is deprecated" in old.warnings()[0] and "peer_token_file" in old.warnings()[0]
    both = parse_config({"daemon": {"token_file": peer, "alert_token_file": alert}}).daemon.resolve_credentials()
    assert both.alert == creds.alert and both.peer == creds.peer
    assert "deprecated" in parse_config({"daemon": {"token": "x" * 16}}).warnings()[0]


def test_tls_keys_go_together(tmp_path: Path) -> None:
    assert "together" in problems({"daemon": {"tls_cert_file": "/c.pem"}})["daemon"]
    assert "needs tls_cert_file" in problems({"daemon": {"tls_client_ca_file": "/ca.pem"}})["daemon"]
    parse_config({"daemon": {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem", "peer_ca_file": "/ca.pem"}})


def test_a_command_on_the_deprecated_token_says_so(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    peer = token_file(tmp_path / "token", "old-single-token-0123456789")
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[daemon]\ntoken_file = "{peer}"\n')
    done = run_cli("check", "--config", str(config), "--only", "host", timeout=120)
    assert "config warning: daemon.token_file is deprecated" in done.stderr and "peer_token_file" in done.stderr

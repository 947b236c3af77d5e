"""Files root keeps for itself: ``state_dir`` and the textfile written through descriptors, never through a symbolic
link; a ``state_dir`` another user owns or may write to refused at start; the token file checked before it is
read. The attacker is ``nobody`` (setpriv), swapping links in a directory it may write to."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgxdoctor.config import ConfigError, load_config, parse_config
from dgxdoctor.sources.statefile import StateFile, atomic_write

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
PYTHON = "/usr/bin/python3"  # the attacker's interpreter: the test's own venv lies under root's home
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None or not os.path.exists(PYTHON), reason="needs root, setpriv and python3"
)

SWAPPER = """
import os, sys, time
directory, victim, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
end = time.monotonic() + seconds
while time.monotonic() < end:
    for name in os.listdir(directory):
        if name.endswith(".tmp"):
            path = os.path.join(directory, name)
            try:
                os.unlink(path)
                os.symlink(victim, path)
            except OSError:
                pass
"""


def as_nobody(*argv: str) -> subprocess.Popen[bytes]:
    assert SETPRIV is not None
    return subprocess.Popen([SETPRIV, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *argv])


@pytest.fixture
def shared() -> Iterator[tuple[Path, Path]]:
    """(a directory nobody may write to, a root-only victim file beside it), outside root's 0700 test tree."""
    top = Path(tempfile.mkdtemp(prefix="dgx-trust-", dir="/tmp"))
    top.chmod(0o755)
    attackable = top / "dir"
    attackable.mkdir()
    attackable.chmod(0o777)
    victim = top / "victim"
    victim.write_text('{"root": "secret"}\n')  # JSON: what a state file read through a link would take in
    victim.chmod(0o600)
    try:
        yield attackable, victim
    finally:
        shutil.rmtree(top)


@needs_root
def test_the_textfile_mode_never_lands_on_a_swapped_link(shared: tuple[Path, Path]) -> None:
    """The textfile writer chmods its temporary file 0644 for node_exporter: by path, a link swapped in made the
    victim 0644 (63 swaps); on the descriptor it cannot."""
    directory, victim = shared
    swapper = as_nobody(PYTHON, "-c", SWAPPER, str(directory), str(victim), "8")
    try:
        for _ in range(400):
            with contextlib.suppress(OSError):  # the attacker replaced the temporary file: this write is lost
                atomic_write(directory / "dgxdoctor.prom", b"dgxdoctor_up 1\n", 0o644)
            assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    finally:
        swapper.kill()
        swapper.wait(timeout=10)
    assert victim.read_text() == '{"root": "secret"}\n'


@needs_root
def test_a_state_file_that_is_a_link_is_neither_read_nor_written_through(shared: tuple[Path, Path]) -> None:
    directory, victim = shared
    planted = as_nobody("/bin/ln", "-s", str(victim), str(directory / "logs_offsets.json"))
    assert planted.wait(timeout=10) == 0
    state = StateFile(directory / "logs_offsets.json")
    assert state.load() == {}
    assert state.save({"offsets": {}})
    assert not (directory / "logs_offsets.json").is_symlink()  # the link was replaced, not written through
    assert victim.read_text() == '{"root": "secret"}\n' and stat.S_IMODE(victim.stat().st_mode) == 0o600


def config_file(tmp_path: Path, state_dir: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\nstate_dir = "{state_dir}"\n')
    return path


@needs_root
def test_a_state_dir_of_another_user_or_open_to_others_is_a_config_error(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o750)
    assert load_config(config_file(tmp_path, state_dir)).paths.state_dir == state_dir
    os.chown(state_dir, NOBODY, NOBODY)
    with pytest.raises(ConfigError) as owned:
        load_config(config_file(tmp_path, state_dir))
    assert owned.value.problems[0][0] == "paths.state_dir" and f"owned by uid {NOBODY}" in str(owned.value)
    os.chown(state_dir, 0, 0)
    state_dir.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by its group or others"):
        load_config(config_file(tmp_path, state_dir))
    assert load_config(config_file(tmp_path, tmp_path / "absent")).paths.state_dir.name == "absent"  # created 0750


@needs_root
def test_the_token_file_must_be_roots_private_regular_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abcdefghijklmnopqrstuvwxyz\n")
    daemon = parse_config({"daemon": {"token_file": str(token)}}).daemon
    token.chmod(0o644)
    with pytest.raises(ValueError, match=r"token is open to its group or others \(mode 0644\)"):
        daemon.resolve_token()
    token.chmod(0o600)
    assert daemon.resolve_token() == "abcdefghijklmnopqrstuvwxyz"
    os.chown(token, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"owned by uid {NOBODY}"):
        daemon.resolve_token()
    os.chown(token, 0, 0)
    link = tmp_path / "token-link"
    link.symlink_to(token)
    with pytest.raises(ValueError, match="is a symbolic link"):
        parse_config({"daemon": {"token_file": str(link)}}).daemon.resolve_token()
    fifo = tmp_path / "token-fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ValueError, match="not a regular file"):  # and never blocks on the FIFO
        parse_config({"daemon": {"token_file": str(fifo)}}).daemon.resolve_token()

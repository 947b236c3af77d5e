"""A rolling upgrade: the previous release's daemon (0.1.0 at 85f803c, built from this repository's history into
.cache/venv-prev by scripts/install-prev-release) runs beside this tree's, two real ``dgxdoctor run`` on loopback
with a shared token, each the other's peer. Both ways, each one's peer_compare fetches the other's /state, validates
it and compares: 1/1 peer answered, no PEER_UNREACHABLE, nothing critical from the release difference; this tree's
names the difference as one PEER_VERSION_SKEW warning (the previous release cannot: its documents carry no version).
Skipped with the reason when the clone's history lacks the release (a shallow clone) or there is no Python 3.11;
the first run installs the release (about 40 s), later ones take about 10 s.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO
from daemonproc import DaemonProc, free_port, running
from dgxdoctor import __version__
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.documents import SCHEMA

pytestmark = pytest.mark.integration

TOKEN = "rolling-upgrade-token-0123456789"
INSTALL = REPO / "scripts" / "install-prev-release"
PREV_PYTHON = REPO / ".cache" / "venv-prev" / "bin" / "python"
SKIP = 3  # the script's exit status for "cannot build the release here"


def previous_release() -> Path:
    """The previous release's Python, installed (idempotent); skips the test when it cannot be built here."""
    done = subprocess.run([str(INSTALL)], cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode == SKIP:
        pytest.skip(done.stderr.strip() or "the previous release cannot be built here")
    assert done.returncode == 0, done.stderr[-2000:]
    return PREV_PYTHON


def check_names(python: Path) -> list[str]:
    """The checks of the release ``python`` runs (each release's config refuses names it does not know)."""
    code = "from dgxdoctor.checks.registry import ALL_CHECKS; print(' '.join(c.name for c in ALL_CHECKS))"
    done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def config(name: str, work: Path, peer_port: int, checks: list[str]) -> str:
    quiet = "".join(f"[checks.{c}]\nenabled = false\n" for c in checks if c != "peer_compare")
    return (
        f'[node]\nname = "{name}"\n'
        f'[paths]\nstate_dir = "{work / "state"}"\n'
        f'[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\npeers = ["http://127.0.0.1:{peer_port}"]\n'
        f"peer_timeout_s = 2.0\n[checks.peer_compare]\ninterval_s = 1.0\n{quiet}"
    )


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    prev = previous_release()
    new_port, old_port = free_port(), free_port()
    new = DaemonProc(tmp_path / "dgx-a", config("dgx-a", tmp_path / "dgx-a", old_port, [f.name for f in ALL_CHECKS]),
                     port=new_port, token=TOKEN)  # fmt: skip
    old = DaemonProc(
        tmp_path / "dgx-b",
        config("dgx-b", tmp_path / "dgx-b", new_port, check_names(prev)),
        port=old_port,
        token=TOKEN,
        python=str(prev),
        program=("-I", "-m", "dgxdoctor", "run", "--config"),
        env={"PYTHONPATH": ""},
    )  # fmt: skip  (-I: the release's own package, never this tree's src)
    with running(new, old):
        yield new, old


def test_the_previous_release_and_this_one_compare_each_other(nodes: tuple[DaemonProc, DaemonProc]) -> None:
    new, old = nodes
    answered = "1/1 peer(s) answered"
    for node in (new, old):
        node.wait_for(lambda n=node: n.check("peer_compare")["summary"].startswith(answered), 30, "peer answer")
    assert old.get("/healthz").json()["version"] == "0.1.0"  # the release itself, not this tree
    state = new.get("/state", auth=True).json()
    assert (state["schema"], state["agent_version"]) == (SCHEMA, __version__)
    assert "schema" not in old.get("/state", auth=True).json()

    seen = new.check("peer_compare")
    skew = [f for f in seen["findings"] if f["code"] == "PEER_VERSION_SKEW"]
    assert [(f["status"], f["subject"]) for f in skew] == [("warning", None)], seen
    assert skew[0]["message"] == (
        f"the nodes run different releases: dgx-a runs dgxdoctor {__version__} (results schema {SCHEMA}), "
        "dgx-b runs dgxdoctor of an earlier release (results schema 1, which sends no version)"
    )
    for node in (new, old):
        compare = node.check("peer_compare")
        assert compare["status"] in ("ok", "warning"), compare
        assert [f["code"] for f in compare["findings"] if f["status"] in ("critical", "unknown")] == [], compare
        assert "PEER_UNREACHABLE" not in {f["code"] for f in compare["findings"]}, compare
        assert node.metric("dgxdoctor_peer_up", peer=f"127.0.0.1:{(old if node is new else new).port}") == 1.0

"""The status page at GET / of two real daemons, rendered by a real headless Chromium (Debian's ``chromium``) in the
three states an operator meets: all OK, a critical node (an XID 79 in dgx-b's kernel log), an unreachable peer
(dgx-b stopped). Chromium sends the token as HTTP Basic's password, as a phone's browser would after its prompt.

``DGXDOCTOR_WRITE_DOCS=1`` writes the screenshots to docs/status-page/ (phone width, 412 px).
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import REPO
from daemonproc import DaemonProc, free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (scripts/install-system-deps)"),
]

TOKEN = "status-page-token-0123456789"
XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
DOCS = REPO / "docs" / "status-page"
PHONE = "412,1700"


def config(tmp: Path, name: str, peer_port: int) -> str:
    off = "\n".join(
        f"[checks.{c}]\nenabled = false"
        for c in ("gpu", "topology", "infiniband", "nccl_env", "vllm", "bench", "ray", "host", "logs")
    )
    return (
        f'node = "{name}"\n[paths]\nstate_dir = "{tmp / name}"\nkmsg_path = "{tmp / f"kmsg-{name}.log"}"\n'
        f'sysfs_root = "{tmp / "nosys"}"\n[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\n'
        f'peers = ["http://127.0.0.1:{peer_port}"]\npeer_timeout_s = 1.0\n'
        f"[checks.peer_compare]\ninterval_s = 1.0\n[checks.xid]\ninterval_s = 1.0\n{off}\n"
    )


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    pa, pb = free_port(), free_port()
    for name in ("dgx-a", "dgx-b"):
        (tmp_path / f"kmsg-{name}.log").write_text("")
    a = DaemonProc(tmp_path / "a", config(tmp_path, "dgx-a", pb), port=pa, token=TOKEN)
    b = DaemonProc(tmp_path / "b", config(tmp_path, "dgx-b", pa), port=pb, token=TOKEN)
    try:
        for d in (a, b):
            d.start()
        for d in (a, b):
            d.wait_healthy()
        yield a, b
    finally:
        for d in (a, b):
            if d.proc is not None:
                d.stop()


def page(node: DaemonProc) -> str:
    return httpx.get(f"{node.url}/", auth=("operator", TOKEN), timeout=10).text


def chromium(node: DaemonProc, out: Path) -> str:
    """The page as Chromium rendered it (its DOM after layout), and a screenshot at a phone's width."""
    url = f"http://operator:{TOKEN}@127.0.0.1:{node.port}/"
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={PHONE}"]
    shot = subprocess.run([*base, f"--screenshot={out}", url], capture_output=True, text=True, timeout=120)
    assert out.exists() and out.stat().st_size > 10_000, shot.stderr[-2000:]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def shots(tmp_path: Path) -> Path:
    if os.environ.get("DGXDOCTOR_WRITE_DOCS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        return DOCS
    return tmp_path


def test_the_page_in_the_three_states(nodes: tuple[DaemonProc, DaemonProc], tmp_path: Path) -> None:
    a, b = nodes
    where = shots(tmp_path)
    unauthenticated = httpx.get(f"{a.url}/", timeout=5)
    assert unauthenticated.status_code == 401 and unauthenticated.headers["WWW-Authenticate"].startswith("Basic")

    a.wait_for(lambda: "cluster OK" in page(a) and "dgx-b" in page(a), 60, "all OK on the page")
    dom = chromium(a, where / "all-ok.png")
    assert "cluster OK" in dom and "nothing is wrong on any node that answered" in dom
    assert 'href="/metrics"' in dom and 'href="/state"' in dom

    with (b.workdir.parent / "kmsg-dgx-b.log").open("a") as fh:
        fh.write(XID_79 + "\n")
    a.wait_for(lambda: "cluster CRITICAL" in page(a) and "XID_79" in page(a), 60, "dgx-b critical on dgx-a's page")
    dom = chromium(a, where / "critical-node.png")
    assert "cluster CRITICAL" in dom and "XID_79" in dom and "remedy" in dom
    # The peer's finding with its own remedy, as dgx-b's /state carries it (before: a peer's findings had none).
    state = httpx.get(f"{b.url}/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    xid = next(f for c in state["checks"] if c["name"] == "xid" for f in c["findings"] if f["code"] == "XID_79")
    assert xid["remedy"] and f'<div class="remedy">{html.escape(xid["remedy"], quote=False)}</div></li>' in dom

    b.stop()
    a.wait_for(lambda: "unreachable" in page(a), 60, "dgx-b unreachable on dgx-a's page")
    dom = chromium(a, where / "unreachable-peer.png")
    assert "unreachable" in dom and "UNKNOWN" in dom and "check dgxdoctor on that node" in dom

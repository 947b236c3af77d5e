"""The status page at GET / of two real daemons, rendered by a real headless Chromium (Debian's ``chromium``) in the
three states an operator meets: all OK, a critical node (an XID 79 in dgx-b's kernel log), an unreachable peer
(dgx-b stopped), on a phone (412 px wide) and on a wall (1280x900: the node-by-check grid in the first screen,
beside what is wrong). Chromium sends the token as HTTP Basic's password, as a browser would after its prompt;
with JavaScript off the page still reloads itself every ``page_refresh_s``. Chromium is driven over the DevTools
protocol (``headless.Browser``) to read where the page laid its sections out.

``DGXDOCTOR_WRITE_DOCS=1`` writes the screenshots to docs/status-page/.
"""

from __future__ import annotations

import html
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import REPO
from daemonproc import DaemonProc, free_port
from headless import Browser

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (scripts/install-system-deps)"),
]

TOKEN = "status-page-token-0123456789"
XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
DOCS = REPO / "docs" / "status-page"
PHONE = (412, 1700)
WALL = (1280, 900)
B_REFRESH_S = 2  # dgx-b's page reloads every 2 s (dgx-a's keeps the default, 30 s, as the screenshots show)


def config(tmp: Path, name: str, peer_port: int, refresh: str = "") -> str:
    off = "\n".join(
        f"[checks.{c}]\nenabled = false"
        for c in ("gpu", "topology", "infiniband", "nccl_env", "vllm", "bench", "ray", "host", "logs")
    )
    return (
        f'node = "{name}"\n[paths]\nstate_dir = "{tmp / name}"\nkmsg_path = "{tmp / f"kmsg-{name}.log"}"\n'
        f'sysfs_root = "{tmp / "nosys"}"\n[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\n'
        f'peers = ["http://127.0.0.1:{peer_port}"]\npeer_timeout_s = 1.0\n{refresh}'
        f"[checks.peer_compare]\ninterval_s = 1.0\n[checks.xid]\ninterval_s = 1.0\n{off}\n"
    )


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    pa, pb = free_port(), free_port()
    for name in ("dgx-a", "dgx-b"):
        (tmp_path / f"kmsg-{name}.log").write_text("")
    a = DaemonProc(tmp_path / "a", config(tmp_path, "dgx-a", pb), port=pa, token=TOKEN)
    refresh = f"page_refresh_s = {B_REFRESH_S}\n"
    b = DaemonProc(tmp_path / "b", config(tmp_path, "dgx-b", pa, refresh), port=pb, token=TOKEN)
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


def url(node: DaemonProc) -> str:
    return f"http://127.0.0.1:{node.port}/"


def phone(browser: Browser, node: DaemonProc, out: Path) -> str:
    """The page as Chromium rendered it at a phone's width (its DOM after layout), and a screenshot."""
    browser.open(url(node), *PHONE, auth=("operator", TOKEN))
    browser.screenshot(out)
    assert out.stat().st_size > 10_000
    grid, wrong = browser.rect("#grid"), browser.rect("#wrong")
    assert grid["bottom"] <= wrong["top"], (grid, wrong)  # one column: the grid above what is wrong
    return browser.dom()


def wall(browser: Browser, node: DaemonProc, out: Path) -> dict[str, dict[str, float]]:
    """The first screen at 1280x900, and where its sections are: the grid whole in it, what is wrong beside it."""
    browser.open(url(node), *WALL, auth=("operator", TOKEN))
    browser.screenshot(out)
    grid, wrong = browser.rect("#grid table"), browser.rect("#wrong")
    assert grid["top"] >= 0 and grid["bottom"] <= WALL[1], grid
    assert wrong["left"] >= grid["right"] and wrong["top"] < 200, (grid, wrong)
    return {"grid": grid, "wrong": wrong}


def shots(tmp_path: Path) -> Path:
    if os.environ.get("DGXDOCTOR_WRITE_DOCS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        return DOCS
    return tmp_path


def in_first_screen(browser: Browser, text: str) -> bool:
    """Whether the first <li> holding ``text`` starts within the wall's first screen."""
    top = browser.evaluate(
        f"(l => l ? l.getBoundingClientRect().top : null)"
        f"([...document.querySelectorAll('li')].find(l => l.textContent.includes({text!r})))"
    )
    return top is not None and 0 <= top < WALL[1]


def remedy_in_dom(remedy: str) -> str:
    """A remedy as the browser serializes the page's rendering: `command` spans as <code>, text escaped."""
    pieces = re.split(r"`([^`\n]+)`", remedy)
    escaped = [html.escape(p, quote=False) for p in pieces]
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(escaped))


def test_the_page_in_the_three_states(nodes: tuple[DaemonProc, DaemonProc], tmp_path: Path) -> None:
    a, b = nodes
    where = shots(tmp_path)
    unauthenticated = httpx.get(f"{a.url}/", timeout=5)
    assert unauthenticated.status_code == 401 and unauthenticated.headers["WWW-Authenticate"].startswith("Basic")

    a.wait_for(lambda: "cluster OK" in page(a) and "dgx-b" in page(a), 60, "all OK on the page")
    with Browser(tmp_path / "chromium") as browser:
        dom = phone(browser, a, where / "all-ok.png")
        assert "cluster OK" in dom and "nothing is wrong on any node that answered" in dom
        assert 'href="/metrics"' in dom and 'href="/state"' in dom and "refreshes every 30 s" in dom
        wall(browser, a, where / "wall-all-ok.png")

        # A wall display reloads the page itself, with JavaScript off too: dgx-b's every 2 s.
        browser.open(url(b), *WALL, auth=("operator", TOKEN), scripts=False)
        took = [browser.wait_event("Page.loadEventFired", 30) for _ in range(2)]
        assert all(t > B_REFRESH_S * 0.9 for t in took), took  # the page's own cadence, not a load of ours

        with (b.workdir.parent / "kmsg-dgx-b.log").open("a") as fh:
            fh.write(XID_79 + "\n")
        a.wait_for(lambda: "cluster CRITICAL" in page(a) and "XID_79" in page(a), 60, "dgx-b critical on dgx-a's page")
        dom = phone(browser, a, where / "critical-node.png")
        assert "cluster CRITICAL" in dom and "XID_79" in dom and "remedy" in dom
        # The peer's finding with its own remedy, as dgx-b's /state carries it (before: a peer's findings had none).
        state = httpx.get(f"{b.url}/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
        xid = next(f for c in state["checks"] if c["name"] == "xid" for f in c["findings"] if f["code"] == "XID_79")
        assert xid["remedy"] and f'<div class="remedy">{remedy_in_dom(xid["remedy"])}</div></li>' in dom
        assert "`" not in dom.split('<section id="wrong">')[1].split("</section>")[0]
        wall(browser, a, where / "wall-critical-node.png")
        # On the wall: the grid says which node and which check, what is wrong beside it says why and what to do.
        assert in_first_screen(browser, "XID_79")

        b.stop()
        a.wait_for(lambda: "unreachable" in page(a), 60, "dgx-b unreachable on dgx-a's page")
        dom = phone(browser, a, where / "unreachable-peer.png")
        assert "unreachable" in dom and "UNKNOWN" in dom and "check dgxdoctor on that node" in dom
        wall(browser, a, where / "wall-unreachable-peer.png")

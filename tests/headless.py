"""A real headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages
ending in NUL on fds 3 and 4; no WebSocket client needed): load a page at a given window size, read where its
elements were laid out, take a screenshot, count the page's own reloads.

What runs is DevTools' evaluation, never a script of the page's (the status page's CSP allows none).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")


class Browser:
    """One Chromium, one tab. ``with Browser(tmp) as b: b.open(url, 1280, 900, auth=...)``."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.replies: dict[int, dict[str, Any]] = {}
        self.next_id = 0
        self.session = ""
        self.cond = threading.Condition()

    def __enter__(self) -> Browser:
        assert CHROMIUM is not None
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4.
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]  # fmt: skip
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log = self.profile / "chromium.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", f'exec "$@" 3<&{to_chrome} 4>&{from_chrome}', "chromium", *argv],
                pass_fds=(to_chrome, from_chrome),
                stdout=log,
                stderr=log,
            )
        os.close(to_chrome)
        os.close(from_chrome)
        threading.Thread(target=self._reader, daemon=True).start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable")
        self.call("Network.enable")
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(AssertionError, OSError):
            self.call("Browser.close", session=False, timeout=10)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)

    def _reader(self) -> None:
        buf = b""
        while chunk := os.read(self._read, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self.cond:
                        self.replies[message["id"]] = message
                        self.cond.notify_all()
                else:
                    self.events.put(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = True,
             timeout: float = 60) -> dict[str, Any]:  # fmt: skip
        self.next_id += 1
        ask: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            ask["sessionId"] = self.session
        os.write(self._write, json.dumps(ask).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.next_id not in self.replies:
                assert self.proc.poll() is None, f"{method}: chromium exited {self.proc.returncode}\n{self.log_tail()}"
                assert time.monotonic() < deadline, f"{method}: no answer in {timeout} s\n{self.log_tail()}"
                self.cond.wait(0.5)
            reply = self.replies.pop(self.next_id)
        assert "error" not in reply, f"{method}: {reply['error']}"
        return dict(reply.get("result", {}))

    def wait_event(self, method: str, timeout: float) -> float:
        """Wait for the tab's next ``method`` event; the seconds it took."""
        start = time.monotonic()
        while (left := start + timeout - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            if event.get("method") == method and event.get("sessionId") == self.session:
                return time.monotonic() - start
        raise AssertionError(f"no {method} within {timeout} s\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def drain(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()

    def open(self, url: str, width: int, height: int, *, auth: tuple[str, str] | None = None,
             scripts: bool = True) -> None:  # fmt: skip
        """Load ``url`` in a ``width`` x ``height`` window (a desktop browser's, not a phone's emulation)."""
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        self.call("Emulation.setScriptExecutionDisabled", {"value": not scripts})
        if auth is not None:
            basic = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            self.call("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {basic}"}})
        self.drain()
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", 60)

    def evaluate(self, expression: str) -> Any:
        """DevTools' evaluation in the page (not the page's own script: its CSP does not apply)."""
        got = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        assert "exceptionDetails" not in got, got["exceptionDetails"]
        return got["result"].get("value")

    def rect(self, selector: str) -> dict[str, float]:
        """Where ``selector``'s first element was laid out, in CSS pixels from the top left of the first screen."""
        found = self.evaluate(f"(e => e && e.getBoundingClientRect().toJSON())(document.querySelector({selector!r}))")
        assert found is not None, f"{selector}: not on the page"
        return dict(found)

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, out: Path) -> None:
        """The window as it shows (the first screen, not the whole page)."""
        out.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"]))

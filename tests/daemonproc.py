"""A real ``dgxdoctor run`` in a subprocess for the hardening and fault tests: started under the unit's
``LimitNOFILE``, its log kept in a file, stopped with SIGTERM and timed."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO

UNIT = REPO / "systemd" / "dgxdoctor.service"


def unit_setting(key: str) -> str:
    """A ``Key=value`` of systemd/dgxdoctor.service (the last one, as systemd reads it)."""
    found = re.findall(rf"^{key}=(.*)$", UNIT.read_text(), re.MULTILINE)
    assert found, f"{key} not in {UNIT}"
    return found[-1].strip()


def unit_nofile() -> int:
    return int(unit_setting("LimitNOFILE"))


def unit_stop_timeout_s() -> float:
    return float(unit_setting("TimeoutStopSec"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def raise_own_nofile(wanted: int) -> None:
    """Let the test process hold ``wanted`` sockets (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


@dataclass
class DaemonProc:
    workdir: Path
    config_body: str
    nofile: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    prefix: Sequence[str] = ()  # e.g. ("ip", "netns", "exec", NS)
    program: Sequence[str] = ("-m", "dgxdoctor", "run", "--config")  # run by ``python``, the config path after it
    python: str = sys.executable  # another release's: its own venv's (tests/integration/test_rolling_upgrade.py)
    port: int = 0
    host: str = "127.0.0.1"
    token: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    scheme: str = "http"  # "https" for a daemon with [daemon] tls_cert_file
    verify: Any = True  # what httpx verifies an https daemon with (an ssl.SSLContext trusting the test CA)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "daemon.log"

    def start(self) -> DaemonProc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        config = self.workdir / "config.toml"
        config.write_text(self.config_body.replace("@LISTEN@", f"{self.host}:{self.port}"))
        nofile = self.nofile

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **self.env}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, self.python, *self.program, str(config)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=limits,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def get(self, path: str, timeout: float = 5.0, auth: bool = False) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        return httpx.get(f"{self.url}{path}", timeout=timeout, headers=headers, verify=self.verify)

    def wait_healthy(self, limit_s: float = 60.0) -> None:
        self.wait_for(lambda: self.get("/healthz", timeout=2).status_code == 200, limit_s, "healthy")

    def wait_for(self, predicate: Callable[[], bool], limit_s: float, what: str) -> float:
        """Poll until ``predicate()`` holds; seconds it took. AssertionError with the log's tail if it never does."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            assert self.proc is not None and self.proc.poll() is None, f"daemon exited:\n{self.log_tail()}"
            try:
                if predicate():
                    return time.monotonic() - t0
            except (httpx.HTTPError, OSError, KeyError, ValueError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"not {what} within {limit_s} s:\n{self.log_tail()}")

    def check(self, name: str) -> dict[str, Any]:
        """The check ``name`` of the daemon's /state; ``{"summary": ""}`` while it has not run yet."""
        doc = self.get("/state", auth=True).json()
        found: dict[str, Any] = next((c for c in doc["checks"] if c["name"] == name), {"summary": ""})
        return found

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.get("/metrics").text
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))
                out[(s.name, labels)] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, limit_s: float = 60.0) -> tuple[int | None, float]:
        """SIGTERM; (exit status or None if it had to be killed, seconds to exit)."""
        assert self.proc is not None
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - t0
        self.kill()
        return code, seconds

    def kill(self) -> None:
        """SIGKILL the daemon's whole session (it and whatever it started), as systemd's stop would."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@contextlib.contextmanager
def running(*procs: DaemonProc, healthy_s: float = 30.0, stop_s: float = 20.0) -> Iterator[tuple[DaemonProc, ...]]:
    """Start every daemon first, then wait until each answers /healthz (peers find each other already up); on the
    way out stop each one that was started, whatever happened inside."""
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.wait_healthy(healthy_s)
        yield procs
    finally:
        for proc in procs:
            if proc.proc is not None:
                proc.stop(stop_s)

"""One node as the README installs it, inside its namespaces (namespaces.py).

The node's root directory mirrors the installed paths::

    ROOT/etc/dgxdoctor/config.toml   the README's config (name, role, the token files, peers, [checks.ray] ray_command),
                                     plus what the test adds ([paths] into ROOT, intervals, checks turned off)
    ROOT/etc/dgxdoctor/*.token       `head -c 32 /dev/urandom | base64`, 0600: read, alert, and peer (the same on
                                     every node)
    ROOT/var/lib/dgxdoctor           the unit's StateDirectory (0750): state, audit (remediation.jsonl)
    ROOT/run/dgxdoctor               the unit's RuntimeDirectory (0700), its TMPDIR
    ROOT/dev/kmsg                    a private kernel log (a plain file: the machine's ring is shared by every job)
    ROOT/var/log/journal             the node's journal (journalwriter.py writes it through systemd-journal-remote)
    ROOT/usr/bin/systemctl           a fake that records each call in ROOT/systemctl.calls and succeeds (once
                                     answered in ROOT/systemctl.answered, where a test plays systemd: FAKE_SYSTEMCTL)

The daemon starts as systemd/dgxdoctor.service would start it: its ExecStart (`dgxdoctor run --config
/etc/dgxdoctor/config.toml`, both paths mapped into ROOT), its Environment=, LimitNOFILE=, Nice= and UMask=,
systemd's PATH (ROOT/usr/bin first) and a NOTIFY_SOCKET (Type=notify): it is up when it sends READY=1.
"""

from __future__ import annotations

import base64
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from dgxdoctor.checks.registry import ALL_CHECKS
from harness.namespaces import NodeNamespaces, Spawned

UNIT = REPO / "systemd" / "dgxdoctor.service"
README = REPO / "README.md"
PORT = 9835  # the daemon's default listen port, as the README's curl and peers use it
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what systemd gives a service
# Each call: "VERB UNIT" in the node's ROOT/systemctl.calls, "NODE: VERB UNIT" in the cluster's (the order across
# nodes); it succeeds. Where a test plays systemd's part (ROOT/systemctl.answered exists), the call returns only once
# the test has answered it (one line there per call, in order), as `systemctl restart` returns once its job is done:
# a restart whose verification ran before the world changed would end before the restart happened.
FAKE_SYSTEMCTL = """#!/bin/sh
printf "%s\\n" "$*" >> "{calls}"
printf "{node}: %s\\n" "$*" >> "{everyone}"
if [ -e "{answered}" ]; then
    n=$(wc -l < "{calls}"); i=0
    while [ "$(wc -l < "{answered}")" -lt "$n" ] && [ "$i" -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
fi
exit 0
"""


def unit_values(key: str) -> list[str]:
    """Every ``Key=value`` of the shipped dgxdoctor.service, in order."""
    return [v.strip() for v in re.findall(rf"^{key}=(.*)$", UNIT.read_text(), re.MULTILINE)]


def unit_value(key: str) -> str:
    found = unit_values(key)
    assert found, f"{key} not in {UNIT}"
    return found[-1]


def dgxdoctor_program() -> list[str]:
    """The installed console script of this checkout's venv (`pip install .` puts it beside the Python)."""
    script = Path(sys.executable).with_name("dgxdoctor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dgxdoctor"]


def new_token() -> str:
    """What the README's `head -c 32 /dev/urandom | base64` writes."""
    return base64.b64encode(os.urandom(32)).decode() + "\n"


def readme_config() -> dict[str, dict[str, Any]]:
    """The config the README's install writes (its `printf '...' > /etc/dgxdoctor/config.toml`), as flat tables
    (``{"checks.ray": {...}}``): the harness starts from exactly what an operator installs."""
    from dgxdoctor.compat import tomllib

    found = re.search(r"^printf '(.*?)' \\\n\s*> /etc/dgxdoctor/config\.toml$", README.read_text(), re.MULTILINE)
    assert found, f"no `printf '...' > /etc/dgxdoctor/config.toml` in {README}"
    flat: dict[str, dict[str, Any]] = {}

    def walk(prefix: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk(f"{prefix}.{key}" if prefix else key, value)
            else:
                flat.setdefault(prefix, {})[key] = value

    walk("", tomllib.loads(found.group(1).replace("\\n", "\n")))
    assert "" not in flat, "the README's config has top-level keys"
    return flat


def toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


def tables(doc: dict[str, dict[str, Any]]) -> str:
    """``{"checks.vllm": {"interval_s": 1.0}}`` as TOML tables."""
    return "".join(f"[{name}]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in body.items()) for name, body in doc.items())


class Node:
    """One dgxdoctor node: namespaces, the installed layout, its daemon and the processes it watches."""

    def __init__(
        self, name: str, role: str | None, ns: NodeNamespaces, root: Path, token: str, peers: Sequence[str]
    ) -> None:
        self.name, self.role, self.ns, self.root = name, role, ns, root
        self.peers = list(peers)
        self.daemon: Spawned | None = None
        self.notify: socket.socket | None = None
        self.etc = root / "etc" / "dgxdoctor"
        self.state = root / "var" / "lib" / "dgxdoctor"
        self.runtime = root / "run" / "dgxdoctor"
        self.kmsg = root / "dev" / "kmsg"
        self.journal = root / "var" / "log" / "journal"
        self.bin = root / "usr" / "bin"
        self.etc.mkdir(parents=True, mode=0o750)
        # The README's three token files: the peer token the same on every node, the read and alert tokens the node's.
        for kind, value in (("peer", token), ("read", new_token()), ("alert", new_token())):
            (self.etc / f"{kind}.token").write_text(value)
            (self.etc / f"{kind}.token").chmod(0o600)
        self.state.mkdir(parents=True, mode=0o750)
        self.runtime.mkdir(parents=True, mode=0o700)
        self.kmsg.parent.mkdir(parents=True)
        self.kmsg.write_text("")
        self.journal.mkdir(parents=True)
        self.bin.mkdir(parents=True)
        systemctl = self.bin / "systemctl"
        everyone = root.parent / "systemctl.calls"
        self.systemctl_answered = root / "systemctl.answered"
        systemctl.write_text(FAKE_SYSTEMCTL.format(calls=root / "systemctl.calls", node=name, everyone=everyone,
                                                   answered=self.systemctl_answered))  # fmt: skip
        systemctl.chmod(0o755)

    # -- layout ------------------------------------------------------------------------------------------------

    @property
    def ip(self) -> str:
        return self.ns.ip

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{PORT}"

    @property
    def config(self) -> Path:
        return self.etc / "config.toml"

    @property
    def token(self) -> str:
        """The peer token: the peer endpoints, and /state and the page as the read token would."""
        return (self.etc / "peer.token").read_text().strip()

    @property
    def alert_token(self) -> str:
        """What Alertmanager sends to this node's /alertmanager."""
        return (self.etc / "alert.token").read_text().strip()

    def configure(self, extra: dict[str, dict[str, Any]] | None = None, only: Iterable[str] | None = None,
                  node: dict[str, Any] | None = None) -> None:  # fmt: skip
        """Write config.toml: the README's (readme_config(), with this node's name, role and peers and the token
        file under ROOT), the node's paths under ROOT, ``extra`` tables merged in (a table the README writes gets
        the keys added), every check not in ``only`` turned off (all on when None)."""
        doc = readme_config()
        doc["node"].update({"name": self.name, "role": self.role, **(node or {})})
        if self.role is None:  # no role declared (the README's `role` line left out)
            del doc["node"]["role"]
        files = {k: v.replace("/etc/dgxdoctor", str(self.etc)) for k, v in doc["daemon"].items() if k.endswith("_file")}
        doc["daemon"].update({**files, "peers": self.peers})
        doc["paths"] = {"state_dir": str(self.state), "kmsg_path": str(self.kmsg)}
        doc["checks.logs"] = {"journal_directory": str(self.journal)}
        for name, body in (extra or {}).items():
            doc.setdefault(name, {}).update(body)
        if only is not None:
            keep = set(only)
            for factory in ALL_CHECKS:
                if factory.name not in keep:
                    doc[f"checks.{factory.name}"] = {**doc.get(f"checks.{factory.name}", {}), "enabled": False}
        self.config.write_text(tables(doc))

    def install_nccl_env(self, **site: str) -> None:
        """The README's `install systemd/nccl.env as /etc/nccl.env and systemd/nccl.sh as /etc/profile.d/nccl.sh`,
        into ROOT, with the site's values (``site``: the lines an operator edits, e.g. NCCL_SOCKET_IFNAME)."""
        lines = []
        for line in (REPO / "systemd" / "nccl.env").read_text().splitlines():
            key = line.split("=", 1)[0]
            lines.append(f"{key}={site.pop(key)}" if "=" in line and not line.startswith("#") and key in site else line)
        assert not site, f"not in systemd/nccl.env: {site}"
        (self.root / "etc" / "profile.d").mkdir(parents=True, exist_ok=True)
        (self.root / "etc" / "nccl.env").write_text("\n".join(lines) + "\n")
        shutil.copyfile(REPO / "systemd" / "nccl.sh", self.root / "etc" / "profile.d" / "nccl.sh")

    # -- the daemon, as the unit runs it ------------------------------------------------------------------------

    def unit_argv(self) -> list[str]:
        """ExecStart with the installed paths mapped: /opt/dgxdoctor/bin/dgxdoctor -> this checkout's script,
        /etc/dgxdoctor -> ROOT/etc/dgxdoctor."""
        exec_start = unit_value("ExecStart").split()
        assert exec_start[0] == "/opt/dgxdoctor/bin/dgxdoctor", exec_start
        return [*dgxdoctor_program(), *(a.replace("/etc/dgxdoctor", str(self.etc)) for a in exec_start[1:])]

    def unit_env(self, notify: Path | None) -> dict[str, str]:
        env = {"PATH": f"{self.bin}:{SYSTEMD_PATH}", "LANG": "C.UTF-8", "PYTHONPATH": str(REPO / "src")}
        for assignment in unit_values("Environment"):
            key, _, value = assignment.partition("=")
            env[key] = value.replace("/run/dgxdoctor", str(self.runtime))
        if notify is not None:
            env["NOTIFY_SOCKET"] = str(notify)
            env["WATCHDOG_USEC"] = str(int(float(unit_value("WatchdogSec").rstrip("s")) * 1_000_000))
        return env

    def start_daemon(self, limit_s: float = 60.0, program: Sequence[str] | None = None,
                     env: dict[str, str] | None = None) -> float:  # fmt: skip
        """Start `dgxdoctor run` as the unit does and wait for READY=1; the seconds it took. ``program`` (run with
        the config's path after it) replaces the unit's for a daemon with a hardware seam filled (the NVML capture
        of tests/faults/agent.py); ``env`` is added to the unit's."""
        nofile = int(unit_value("LimitNOFILE"))
        nice = int(unit_value("Nice"))
        umask = int(unit_value("UMask"), 8)

        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            os.nice(nice)
            os.umask(umask)

        notify_path = self.root / "notify.sock"
        notify_path.unlink(missing_ok=True)
        # Held open while the daemon runs, as systemd holds it: the daemon's WATCHDOG=1 pings land there.
        self.notify = notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(notify_path))
        t0 = time.monotonic()
        argv = [*program, str(self.config)] if program else self.unit_argv()
        self.daemon = self.ns.spawn(argv, env={**self.unit_env(notify_path), **(env or {})}, log=self.log_path,
                                    cwd=Path("/"), preexec=limits)  # fmt: skip
        notify.settimeout(0.5)
        while True:
            assert self.daemon.alive(), f"{self.name}: the daemon exited:\n{self.log_tail()}"
            assert time.monotonic() - t0 < limit_s, f"{self.name}: no READY=1 in {limit_s} s:\n{self.log_tail()}"
            try:
                if b"READY=1" in notify.recv(4096).split(b"\n"):
                    # Read from then on, as systemd does: a queue left full blocks the daemon's next WATCHDOG=1
                    # (a blocking send on its event loop) after a few minutes.
                    threading.Thread(target=_drain, args=(notify,), daemon=True).start()
                    return time.monotonic() - t0
            except TimeoutError:
                continue

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.stop(float(unit_value("TimeoutStopSec")))
        if self.notify is not None:
            self.notify.close()
            self.notify = None

    @property
    def log_path(self) -> Path:
        return self.root / "daemon.log"

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- reading the node, from the host (through the bridge) -----------------------------------------------------

    def get(self, path: str, auth: bool = False, timeout: float = 5.0) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=timeout)

    def checks(self) -> dict[str, dict[str, Any]]:
        """The latest result of each check, from the daemon's /state."""
        return {c["name"]: c for c in self.get("/state", auth=True).json()["checks"]}

    def findings(self, check: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.checks().get(check, {}).get("findings", [])
        return found

    def sample(self, name: str, **labels: str) -> float | None:
        """One series of the daemon's /metrics (labels but ``node``), None when absent."""
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for s in family.samples:
                if s.name == name and {k: v for k, v in s.labels.items() if k != "node"} == labels:
                    return float(s.value)
        return None

    def audit(self) -> list[dict[str, Any]]:
        path = self.state / "remediation.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def systemctl_calls(self) -> list[str]:
        path = self.root / "systemctl.calls"
        return path.read_text().splitlines() if path.exists() else []

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`dgxdoctor ARGS` typed on this node (its namespaces, the unit's environment)."""
        return self.ns.run([*dgxdoctor_program(), *args], env=self.unit_env(None), timeout=timeout, cwd=self.root)

    def wait_for(self, what: str, predicate: Callable[[], Any], limit_s: float, *others: Node) -> Any:
        return wait_for(what, predicate, limit_s, self, *others)


def _drain(notify: socket.socket) -> None:
    """Read the notify socket until it is closed (stop_daemon)."""
    while True:
        try:
            notify.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return


def wait_for(what: str, predicate: Callable[[], Any], limit_s: float, *nodes: Node) -> Any:
    """Poll ``predicate`` until truthy (its value); AssertionError with the nodes' log tails when it never is."""
    t0 = time.monotonic()
    last: Any = None
    while time.monotonic() - t0 < limit_s:
        try:
            last = predicate()
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    logs = "".join(f"\n--- {n.name}:\n{n.log_tail()}" for n in nodes)
    raise AssertionError(f"not {what} within {limit_s:g} s; last: {last!r}{logs}")


def copy_program(source: Path, target: Path) -> Path:
    """``source`` installed as the executable ``target`` (a stand-in takes the name of what it stands for)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(0o755)
    return target

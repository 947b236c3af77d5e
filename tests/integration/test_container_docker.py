"""vLLM in a container, as the runbook runs it (``docker run --network=host --ipc=host ...``), against a real
container engine: Debian's ``docker.io`` (dockerd 20.10, containerd, runc), started here with its own data root,
socket and the vfs storage driver (no overlay mounts, no iptables, no bridge: what a sandbox without systemd allows).

The image is built from a root filesystem this test makes (no registry): the host's ``dash`` and ``sleep`` with the
libraries ``ldd`` names, and a ``vllm`` stand-in script that prints vLLM's start-up line and torch's NCCL watchdog
timeout, then waits. The container runs it as uid 4242, as a user namespace would map root in the container: the
host's owner rule alone would never believe it.

Skipped, saying why, where ``dockerd`` is not installed (``scripts/install-system-deps``) or cannot start here.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dgxdoctor.bundle.build import build_bundle
from dgxdoctor.bundle.items import Sources
from dgxdoctor.checks.drift import DriftCheck, DriftSettings
from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.checks.vllm_executor import VllmExecutorCheck, VllmExecutorSettings
from dgxdoctor.config import Config, parse_config
from dgxdoctor.result import Status
from dgxdoctor.sources.container import Container, inspect, serving
from dgxdoctor.sources.vllm_launch import node_processes
from dgxdoctor.validation import validate

pytestmark = pytest.mark.integration

IMAGE = "dgxd-test:1"
UID = 4242  # a uid no trusted-user rule names: root in the container under a user namespace looks like this
# torch's NCCL watchdog in a rank (tests/fixtures/logs/nccl_timeout.log), on the container's stderr.
NCCL_TIMEOUT = (
    "[rank0]:[E1205 09:00:01.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600003 "
    "milliseconds before timing out."
)
STANDIN = f"""#!/bin/sh
trap 'exit 0' TERM
echo "INFO 12-05 09:00:00 [api_server.py:1000] vLLM API server version 0.32.0"
echo "{NCCL_TIMEOUT}" >&2
while :; do sleep 1; done
"""
HF_TOKEN = "hf_" + "x" * 34


class Engine:
    """A dockerd of this test's own: its socket in ``DOCKER_HOST`` for every ``docker`` the agent starts."""

    def __init__(self, root: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.root = root
        self.proc = proc
        self.log = log
        self.host = f"unix://{root / 'docker.sock'}"

    def docker(self, *args: str, stdin: bytes | None = None, timeout: float = 120) -> str:
        done = subprocess.run(
            ["docker", *args], input=stdin, capture_output=True, timeout=timeout, env={**os.environ,
                                                                                      "DOCKER_HOST": self.host}
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return done.stdout.decode()


def _rootfs() -> bytes:
    """A tar of a root filesystem: dash as /bin/sh, sleep, their libraries, /usr/local/bin/vllm."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        added: set[str] = set()

        def folders(inside: str) -> None:  # each parent as an entry of its own: else the runtime makes it 0700
            for parent in reversed(Path(inside.lstrip("/")).parents[:-1]):
                if str(parent) not in added:
                    added.add(str(parent))
                    info = tarfile.TarInfo(str(parent))
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)

        def add(host: str, inside: str, mode: int = 0o755) -> None:
            if inside in added:
                return
            added.add(inside)
            folders(inside)
            data = Path(host).read_bytes()
            info = tarfile.TarInfo(inside.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for tool, inside in (("dash", "/bin/sh"), ("sleep", "/bin/sleep")):
            path = shutil.which(tool)
            assert path is not None, tool
            add(path, inside)
            libs = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
            for word in libs.split():
                if word.startswith("/"):
                    add(os.path.realpath(word), word, 0o644 if ".so" in word and "ld-linux" not in word else 0o755)
        script = STANDIN.encode()
        folders("/usr/local/bin/vllm")
        info = tarfile.TarInfo("usr/local/bin/vllm")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return out.getvalue()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None:
        pytest.skip("dockerd not installed (Debian package docker.io: scripts/install-system-deps)")
    if os.geteuid() != 0:
        pytest.skip("dockerd needs root")
    root = Path(tempfile.mkdtemp(prefix="dgxd-docker-", dir="/tmp"))  # short: containerd's socket path is bounded
    log = root / "dockerd.log"
    argv = [
        dockerd, f"--data-root={root / 'data'}", f"--exec-root={root / 'exec'}", f"--pidfile={root / 'dockerd.pid'}",
        f"--host=unix://{root / 'docker.sock'}", "--storage-driver=vfs", "--iptables=false", "--ip6tables=false",
        "--bridge=none",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    eng = Engine(root, proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            probe = subprocess.run(["docker", "--host", eng.host, "info"], capture_output=True, timeout=30)
            if probe.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-600:]
                pytest.skip(f"dockerd cannot start here: {tail}")
            time.sleep(0.5)
        eng.docker("import", "-", IMAGE, stdin=_rootfs())
        yield eng
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)


def _unmount_below(root: Path) -> None:
    """What dockerd leaves mounted under its roots when it stops (``exec/netns/default``, an nsfs bind mount)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", point], capture_output=True, timeout=30)


@pytest.fixture
def container(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The runbook's container (host network and IPC, the NCCL environment), running the stand-in as uid 4242."""
    monkeypatch.setenv("DOCKER_HOST", engine.host)
    name = f"dgxd-vllm-{uuid.uuid4().hex[:8]}"
    engine.docker(
        "run", "-d", "--name", name, "--network=host", "--ipc=host", "--user", str(UID), "-e", "NCCL_IB_HCA=mlx5_0",
        "-e", "NCCL_SOCKET_IFNAME=lo", "-e", f"HF_TOKEN={HF_TOKEN}", IMAGE, "/usr/local/bin/vllm", "serve",
        "/models/glm", "--port", "18000",
    )  # fmt: skip
    try:
        _wait_for_log(name, "Watchdog caught")
        yield name
    finally:
        engine.docker("rm", "-f", name)


def _wait_for_log(name: str, text: str, after: str = "") -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=30)
        if (done.stdout + done.stderr).count(text) > after.count(text):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never logged {text!r}")


def _config(name: str, tmp_path: Path, **tables: Any) -> Config:
    raw: dict[str, Any] = {"node": {"name": "dgx-a", "container": name}, "paths": {"state_dir": str(tmp_path)}}
    return parse_config({**raw, **tables})


def test_the_serving_process_is_found_through_the_container(container: str, tmp_path: Path) -> None:
    config = _config(container, tmp_path)
    env = config.environment(one_shot=True)
    state = inspect(env.run_command, Container(container))
    assert not isinstance(state, str) and state.running and state.image == IMAGE

    # The host's owner rule alone: uid 4242's "vllm serve" is a look-alike, never the serving process.
    on_host = node_processes(env.proc_root, env.serving_uid)
    assert on_host.server is None or on_host.server.pid != state.pid
    assert state.pid in [i.pid for i in on_host.ignored]

    boxed = serving(env.run_command, env.proc_root, Container(container))
    assert boxed.server is not None and boxed.server.pid == state.pid and boxed.server.uid == UID
    assert "serve" in boxed.server.cmdline

    check = VllmExecutorCheck(validate(VllmExecutorSettings, {}), env)
    result = check.run()
    assert result.status is Status.OK, result
    assert f"vLLM pid {state.pid}" in result.summary
    assert result.facts["container.name"] == container and result.facts["container.image"] == IMAGE


def test_the_containers_environment_is_read(container: str, tmp_path: Path) -> None:
    config = _config(container, tmp_path)
    settings = validate(NcclEnvSettings, {"env_file": str(tmp_path / "absent.sh")})
    result = NcclEnvCheck(settings, config.environment()).run()
    assert result.facts.get("nccl_env.NCCL_IB_HCA") == "mlx5_0", result
    assert result.facts.get("nccl_env.NCCL_SOCKET_IFNAME") == "lo"


def test_a_docker_logs_line_is_matched_once_then_again_after_a_restart(container: str, tmp_path: Path) -> None:
    config = _config(container, tmp_path)
    settings = validate(LogsSettings, {"vllm_paths": [], "ray_paths": [], "journal_units": []})
    check = LogsCheck(settings, config.environment(one_shot=False))

    def totals() -> dict[str, float]:
        result = check.run()
        return {s.labels["code"]: s.value for s in result.samples if s.metric.name.endswith("_matches_total")}

    first = check.run()
    assert first.status is Status.CRITICAL, first
    matched = [f for f in first.findings if f.code != "LOGS_UNCATALOGUED_ERRORS"]  # other errors: shown, at OK
    assert [(f.code, f.subject) for f in matched] == [("NCCL_TIMEOUT", f"container:{container}")]
    assert "Watchdog caught collective operation timeout" in (matched[0].evidence or "")
    assert totals() == {"NCCL_TIMEOUT": 1.0}  # the cursor: the same line is not counted again

    before = subprocess.run(["docker", "logs", container], capture_output=True, text=True).stderr
    subprocess.run(["docker", "restart", "--time=5", container], check=True, capture_output=True)
    _wait_for_log(container, "Watchdog caught", before)
    assert totals() == {"NCCL_TIMEOUT": 2.0}  # the restarted vLLM's line, once

    one_shot = LogsCheck(settings, config.environment(one_shot=True)).run()
    assert "NCCL_TIMEOUT" in one_shot.summary and f"container {container}" in one_shot.summary


def test_a_missing_container_is_unknown_never_ok(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", engine.host)
    config = _config("dgxd-no-such-container", tmp_path)
    settings = validate(LogsSettings, {"vllm_paths": [], "ray_paths": [], "journal_units": []})
    result = LogsCheck(settings, config.environment(one_shot=False)).run()
    assert result.status is Status.UNKNOWN, result
    assert "No such container" in result.findings[0].message
    executor = VllmExecutorCheck(validate(VllmExecutorSettings, {}), config.environment()).run()
    assert executor.status is Status.UNKNOWN and "CONTAINER_UNREADABLE" in [f.code for f in executor.findings]


async def test_restart_vllm_is_docker_restart_of_the_container(container: str, tmp_path: Path) -> None:
    from dgxdoctor.config import AlertsSettings
    from dgxdoctor.daemon.remediation import make_pager
    from dgxdoctor.judge.consequence import judged
    from dgxdoctor.remediation.actions import VllmTarget
    from dgxdoctor.remediation.audit import AuditLog, guard_state_file
    from dgxdoctor.remediation.engine import Remediator, Targets
    from dgxdoctor.result import CheckResult, Finding

    remediation = {"mode": "act", "role": "head", "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 5,
                   "drain": False}  # fmt: skip
    config = _config(container, tmp_path, remediation=remediation, daemon={"token": "t" * 16})
    started = inspect(config.environment().run_command, Container(container))
    assert not isinstance(started, str)

    def vllm_api(request: httpx.Request) -> httpx.Response:  # vLLM's answers after the restart, at the HTTP boundary
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "glm"}]})
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
        return httpx.Response(200)

    from msgspec.structs import replace

    env = replace(config.environment(one_shot=False), http_transport=httpx.MockTransport(vllm_api))
    dead = CheckResult("vllm", Status.CRITICAL, "dead", (judged(Finding("VLLM_DEAD", Status.CRITICAL, "refused")),))
    targets = Targets(VllmTarget("http://127.0.0.1:18000", "glm"), "http://ray:8265", 1, 0, (), "t" * 16)
    pager = make_pager(AlertsSettings(), env)
    r = Remediator(config.remediation, pager, "dgx-a", tmp_path, targets, lambda: {"vllm": dead}, env=env)
    await r.evaluate()
    deadline = time.monotonic() + 60
    while r.busy.locked() or guard_state_file(tmp_path).read().get("in_flight") is not None:
        assert time.monotonic() < deadline, "the restart never ended"
        await asyncio.sleep(0.1)  # the action runs in its own thread
    action = [e for e in AuditLog(tmp_path).tail(20) if e["event"] == "action"][-1]
    assert action["outcome"] == "success", action
    assert action["steps"][0]["argv"] == ["docker", "restart", container]
    after = inspect(env.run_command, Container(container))
    assert not isinstance(after, str) and after.running and after.pid != started.pid
    assert after.started_at != started.started_at


def test_the_bundle_holds_inspect_and_the_log_tail(container: str, tmp_path: Path) -> None:
    config = _config(container, tmp_path, checks={"logs": {"journal_units": [], "vllm_paths": [], "ray_paths": []}})
    out = tmp_path / "b.tar.gz"
    build_bundle(config, config.environment(), Sources(lambda: {}, lambda: {}, 600.0, bug_report=False), out, 60.0,
                 (), "dgxdoctor bundle")  # fmt: skip
    with tarfile.open(out, "r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    doc = json.loads(files[f"b/dgx-a/container/{container}-inspect.json"])
    assert doc[0]["Name"] == f"/{container}" and doc[0]["Config"]["Image"] == IMAGE and doc[0]["State"]["Pid"] > 0
    assert f"HF_TOKEN={HF_TOKEN}" not in json.dumps(doc) and "HF_TOKEN=<redacted>" in doc[0]["Config"]["Env"]
    log = files[f"b/dgx-a/container/{container}.log"].decode()
    assert "Watchdog caught collective operation timeout" in log and "vLLM API server version" in log
    nccl = files["b/dgx-a/nccl-env.txt"].decode()  # the container's process, uid 4242, is a serving process here
    assert "NCCL_IB_HCA=mlx5_0" in nccl and HF_TOKEN not in nccl


def test_the_version_probe_runs_in_the_container(container: str, tmp_path: Path) -> None:
    """The serving Python is the container's: the probe goes through docker exec (this image has none, and says so:
    never the host's python3 answering for it)."""
    config = _config(container, tmp_path)
    result = DriftCheck(validate(DriftSettings, {}), config.environment()).run()
    said = [f.message for f in result.findings if f.code == "SERVING_PYTHON_UNKNOWN"]
    assert said and f"python3 in container {container}" in said[0], result
    assert "vllm_version" not in result.facts

"""vLLM in a container (``[node] container``) where no container engine runs: the name and runtime checked before
any argv is built, Docker's recorded answers parsed (tests/fixtures/container/), the log read once by its time
stamps, and remediation's steps run through the runtime: a stand-in ``docker`` program (an executable script in
place of the runtime, named by ``container_runtime`` as an operator names podman) records the argv it was given.
The real engine is tests/integration/test_container_docker.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import FIXTURES
from dgxdoctor.config import AlertsSettings, ConfigError, parse_config
from dgxdoctor.daemon.remediation import make_pager
from dgxdoctor.judge.consequence import judged
from dgxdoctor.remediation.actions import VllmTarget, port_impostor
from dgxdoctor.remediation.audit import AuditLog, guard_state_file
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.result import CheckResult, Finding, Status
from dgxdoctor.settings.remediation import RemediationCommands
from dgxdoctor.sources.commands import CommandResult, run_command, run_command_merged
from dgxdoctor.sources.container import Container, container_processes, parse_inspect, read_logs, stamp_ns
from dgxdoctor.sources.vllm_launch import node_processes
from dgxdoctor.validation import validate
from proctree import write_process

RECORDED = FIXTURES / "container"
LOG = (RECORDED / "logs_timestamps.txt").read_text()


@pytest.mark.parametrize("name", ["-rm", "--privileged", "a b", "vllm;reboot", "$(id)", "", "x" * 129, "é"])
def test_a_container_name_that_is_not_one_is_refused(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"node": {"container": name}})
    assert "node.container" in str(info.value)


@pytest.mark.parametrize("runtime", ["docker --debug", "-H", "../docker", "bin/docker", "docker;id", ""])
def test_a_runtime_that_is_not_a_program_is_refused(runtime: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"node": {"container": "vllm", "container_runtime": runtime}})
    assert "node.container_runtime" in str(info.value)


def test_the_container_reaches_the_environment() -> None:
    config = parse_config({"node": {"container": "vllm-glm.1", "container_runtime": "/usr/bin/podman"}})
    assert config.environment().container == Container("vllm-glm.1", "/usr/bin/podman")
    assert parse_config({}).environment().container is None


def test_inspect_as_docker_prints_it() -> None:
    running = parse_inspect((RECORDED / "inspect_running.json").read_text())
    assert (running.name, running.image, running.status, running.running) == ("vllm", "dgxd-test:1", "running", True)
    assert running.pid == 4890 and running.network_mode == "host" and running.ipc_mode == "host"
    assert "NCCL_IB_HCA=mlx5_0" in running.env and running.image_id.startswith("sha256:")
    exited = parse_inspect((RECORDED / "inspect_exited.json").read_text())
    assert (exited.running, exited.pid, exited.status) == (False, 0, "exited")
    with pytest.raises(ValueError):
        parse_inspect("[]")  # no such container


def test_time_stamps_read_to_the_nanosecond() -> None:
    first = LOG.splitlines()[0]
    assert stamp_ns(first) == 1796462868_204789665  # 2026-12-05T09:27:48.204789665Z
    assert stamp_ns("2026-12-05T10:27:48.5+01:00 x") == 1796462868_500000000
    assert stamp_ns("INFO no stamp") is None


def _answer(stdout: str, seen: list[list[str]]) -> Any:
    def run(argv: Any, timeout_s: float, max_chars: int) -> CommandResult:
        seen.append(list(argv))
        return CommandResult(tuple(argv), 0, stdout[:max_chars], "", len(stdout) > max_chars)

    return run


def test_the_log_is_read_from_the_last_line_on_each_line_once() -> None:
    seen: list[list[str]] = []
    box = Container("vllm")
    read = read_logs(_answer(LOG, seen), box, since_ns=0, after_ns=None, max_lines=100, max_chars=1 << 20)
    assert not isinstance(read, str) and len(read.lines) == 4 and not read.more
    assert read.lines[1].text.startswith("[rank0]:[E1205 09:00:01.000000000 ProcessGroupNCCL.cpp:632]")
    assert seen[0] == ["docker", "logs", "--since=0.000000000", "--timestamps", "--tail=101", "vllm"]
    # --since is inclusive: the lines at or before the last one read are left out
    again = read_logs(_answer(LOG, seen), box, since_ns=read.lines[1].ns, after_ns=read.lines[1].ns,
                      max_lines=100, max_chars=1 << 20)  # fmt: skip
    assert not isinstance(again, str) and [x.ns for x in again.lines] == [x.ns for x in read.lines[2:]]
    assert seen[1][2] == "--since=1796462868.214599929"
    capped = read_logs(_answer(LOG, seen), box, since_ns=0, after_ns=None, max_lines=2, max_chars=1 << 20)
    assert (
        not isinstance(capped, str) and capped.more and [x.ns for x in capped.lines] == [x.ns for x in read.lines[2:]]
    )


def test_a_log_that_cannot_be_read_says_why() -> None:
    def fails(argv: Any, timeout_s: float, max_chars: int) -> CommandResult:
        return CommandResult(tuple(argv), 1, "Error response from daemon: No such container: vllm\n", "")

    read = read_logs(fails, Container("vllm"), since_ns=0, after_ns=None, max_lines=10, max_chars=1000)
    assert read == "docker logs vllm exited 1: Error response from daemon: No such container: vllm"


def test_stderr_comes_in_the_same_pipe_in_order(tmp_path: Path) -> None:
    prog = tmp_path / "two-streams"
    prog.write_text("#!/bin/sh\necho one\necho two >&2\necho three\n")
    prog.chmod(0o755)
    done = run_command_merged([str(prog)], 10.0, 1000)
    assert (done.stdout, done.returncode) == ("one\ntwo\nthree\n", 0)


def test_vllms_steps_default_to_the_runtime_and_an_explicit_argv_wins() -> None:
    box = Container("vllm", "/usr/bin/podman")
    cmds = RemediationCommands()
    assert cmds.vllm("restart") == ("systemctl", "restart", "vllm.service")
    assert cmds.vllm("restart", box) == ("/usr/bin/podman", "restart", "vllm")
    assert cmds.vllm("stop", box) == ("/usr/bin/podman", "stop", "vllm")
    assert cmds.worker_argv("vllm_start", box) == ("/usr/bin/podman", "start", "vllm")
    assert cmds.worker_argv("vllm_stop") == ("systemctl", "stop", "vllm-worker-mp.service")
    assert cmds.worker_argv("ray_stop", box) == ("systemctl", "stop", "ray-worker.service")
    given = validate(RemediationCommands, {"restart_vllm": ["/usr/local/bin/restart-vllm"]})
    assert given.vllm("restart", box) == ("/usr/local/bin/restart-vllm",)


def _runtime(tmp_path: Path, pid: int | None = None) -> Path:
    """A stand-in runtime: records each argv, answers ``inspect`` as Docker did for the running container (with
    ``pid`` as its first process, when given)."""
    prog = tmp_path / "docker"
    record = tmp_path / "argv.log"
    answer = tmp_path / "inspect.json"
    doc = json.loads((RECORDED / "inspect_running.json").read_text())
    if pid is not None:
        doc[0]["State"]["Pid"] = pid
    answer.write_text(json.dumps(doc))
    prog.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> {record}\nif [ "$1" = inspect ]; then cat {answer}; exit 0; fi\necho "$2"\n'
    )
    prog.chmod(0o755)
    return prog


def _vllm_api(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "glm"}]})
    if request.url.path == "/v1/chat/completions":
        return httpx.Response(200, json={"usage": {"completion_tokens": 4}})
    if request.url.path == "/api/v0/nodes":  # Ray's dashboard, both nodes alive with 8 GPUs each
        return httpx.Response(200, content=(FIXTURES / "ray" / "healthy-nodes-detail.json").read_bytes())
    return httpx.Response(200)


async def _act(tmp_path: Path, finding: str, **commands: Any) -> list[str]:
    """The head's remediation in act mode on one finding; the runtime's argv, in order."""
    from msgspec.structs import replace

    runtime = _runtime(tmp_path)
    steps = {"ray_stop": ["true"], "ray_start": ["true"], **commands}
    remediation = {"mode": "act", "role": "head", "hold_s": 0, "vllm_start_grace_s": 0, "verify_timeout_s": 2,
                   "ray_ready_timeout_s": 2, "commands": steps}  # fmt: skip
    config = parse_config({"node": {"name": "dgx-a", "container": "vllm", "container_runtime": str(runtime)},
                           "paths": {"state_dir": str(tmp_path)}, "daemon": {"token": "t" * 16},
                           "remediation": remediation})  # fmt: skip
    env = replace(config.environment(one_shot=False), http_transport=httpx.MockTransport(_vllm_api))
    check = "vllm" if finding == "VLLM_DEAD" else "logs"
    result = CheckResult(
        check, Status.CRITICAL, "x", (judged(Finding(finding, Status.CRITICAL, "x", "container:vllm")),)
    )
    targets = Targets(VllmTarget("http://127.0.0.1:18000", "glm"), "http://ray:8265", 2, 16, (), "t" * 16)
    r = Remediator(config.remediation, make_pager(AlertsSettings(), env), "dgx-a", tmp_path, targets,
                   lambda: {result.check: result}, env=env)  # fmt: skip
    await r.evaluate()
    for _ in range(300):
        if not r.busy.locked() and guard_state_file(tmp_path).read().get("in_flight") is None:
            break
        await asyncio.sleep(0.02)
    action = [e for e in AuditLog(tmp_path).tail(20) if e["event"] == "action"][-1]
    assert action["outcome"] == "success", action
    return (tmp_path / "argv.log").read_text().splitlines()


async def test_restart_vllm_restarts_the_container(tmp_path: Path) -> None:
    assert await _act(tmp_path, "VLLM_DEAD") == ["restart vllm"]


async def test_the_heads_cluster_restart_stops_and_starts_the_container_in_the_runbooks_order(tmp_path: Path) -> None:
    assert await _act(tmp_path, "NCCL_TIMEOUT") == ["stop vllm", "start vllm"]


def _tree(root: Path, container_ns: str) -> None:
    """The host's /proc: the container's headless vLLM (uid 4242, as a user namespace maps root) and its rank in
    ``container_ns``; the same argv of uid 4242 outside it; the agent's own namespace ``pid:[4026531836]``."""
    host = "pid:[4026531836]"
    for pid, cmdline, ppid, ns in (
        (100, ["vllm", "serve", "glm", "--nnodes", "2", "--node-rank", "1", "--headless"], 90, container_ns),
        (101, ["VLLM::Worker_TP0"], 100, container_ns),
        (102, ["/bin/sh"], 95, container_ns),  # docker exec: a child of the runtime's shim, not of the first pid
        (200, ["vllm", "serve", "glm", "--nnodes", "2", "--node-rank", "1", "--headless"], 1, host),
        (201, ["VLLM::Worker_TP0"], 200, host),
    ):
        d = write_process(root, pid, cmdline[0][:15], cmdline, uid=4242, ppid=ppid)
        (d / "ns" / "pid").symlink_to(ns)
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").symlink_to(host)


def test_the_containers_processes_are_believed_whatever_their_uid_and_no_others(tmp_path: Path) -> None:
    _tree(tmp_path, "pid:[4026532456]")
    members = container_processes(tmp_path, 100)
    assert sorted(p.pid for p in members) == [100, 101, 102]  # its PID namespace, docker exec's shell too
    found = node_processes(tmp_path, members=frozenset(p.pid for p in members))
    assert found.server is not None and found.server.pid == 100 and [w.pid for w in found.workers] == [101]
    assert sorted((i.pid, i.why) for i in found.ignored) == [(200, "container"), (201, "container")]
    # without the container, uid 4242's processes are nobody's serving vLLM (the owner rule)
    host_view = node_processes(tmp_path)
    assert host_view.server is None and {i.why for i in host_view.ignored} == {"owner"}


def test_a_container_in_the_hosts_pid_namespace_is_its_first_process_and_below(tmp_path: Path) -> None:
    _tree(tmp_path, "pid:[4026531836]")  # --pid=host
    assert sorted(p.pid for p in container_processes(tmp_path, 100)) == [100, 101]
    assert container_processes(tmp_path, 4242) == []  # gone


def test_after_a_restart_the_containers_listener_is_vllm_and_no_other_users(tmp_path: Path) -> None:
    """The verification's port check: the container's server (uid 4242, as a user namespace maps root) listening on
    base_url's port is believed with [node] container; a listener of a user outside it still is not."""
    from proctree import TCP_HEADER, tcp_listen_line

    root = tmp_path / "proc"
    _tree(root, "pid:[4026532456]")
    (root / "net").mkdir()
    (root / "net" / "tcp").write_text(TCP_HEADER + tcp_listen_line(0, 18000, 4242, 9001, "0100007F"))
    (root / "100" / "fd").mkdir()
    (root / "100" / "fd" / "3").symlink_to("socket:[9001]")
    target = VllmTarget("http://127.0.0.1:18000", "glm")
    box = Container("vllm", str(_runtime(tmp_path, pid=100)))
    assert (
        port_impostor(target, root, None) == "port 18000 is held by pid 100 of uid 4242, not the serving user: not vLLM"
    )
    assert port_impostor(target, root, None, box, run_command) is None
    (tmp_path / "other").mkdir()
    elsewhere = Container("vllm", str(_runtime(tmp_path / "other", pid=4343)))  # its first pid: none of these
    assert port_impostor(target, root, None, elsewhere, run_command) is not None


def test_the_serving_stacks_versions_are_asked_in_the_container(tmp_path: Path) -> None:
    """drift's probe through the runtime (``docker exec NAME /usr/bin/python3 -I -c PROBE``), with the interpreter
    of the container's vLLM server; the stand-in runtime answers as that Python would."""
    from dgxdoctor.checks.drift import DriftCheck, DriftSettings

    root = tmp_path / "proc"
    _tree(root, "pid:[4026532456]")
    (root / "100" / "cmdline").write_bytes(b"/usr/bin/python3\0/usr/local/bin/vllm\0serve\0glm\0--headless\0")
    runtime = _runtime(tmp_path, pid=100)
    text = runtime.read_text().replace(
        'echo "$2"', 'echo \'{"python_version": "3.12.3", "vllm_version": "0.32.0", "torch_version": "2.9.0"}\''
    )
    runtime.write_text(text)
    config = parse_config({"node": {"container": "vllm", "container_runtime": str(runtime)},
                           "paths": {"proc_root": str(root), "state_dir": str(tmp_path)}})  # fmt: skip
    result = DriftCheck(validate(DriftSettings, {}), config.environment()).run()
    assert (result.facts["vllm_version"], result.facts["python_version"]) == ("0.32.0", "3.12.3"), result
    ran = (tmp_path / "argv.log").read_text().splitlines()
    assert ran[0] == "inspect --type container vllm"
    assert ran[1].startswith("exec vllm /usr/bin/python3 -I -c import json")


def test_the_vllm_check_asks_the_containers_server_and_not_another_users(tmp_path: Path, fixtures: Path) -> None:
    """The container's API server (uid 4242, as a user namespace maps root) listening on base_url's port: with
    [node] container it is vLLM, asked and judged; without, its uid makes it another user's listener, never asked."""
    from msgspec.structs import replace

    from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
    from proctree import TCP_HEADER, tcp_listen_line

    root = tmp_path / "proc"
    _tree(root, "pid:[4026532456]")
    (root / "100" / "cmdline").write_bytes(b"vllm\0serve\0glm\0--port\x0018000\0")
    (root / "net").mkdir()
    (root / "net" / "tcp").write_text(TCP_HEADER + tcp_listen_line(0, 18000, 4242, 9001, "0100007F"))
    (root / "100" / "fd").mkdir()
    (root / "100" / "fd" / "3").symlink_to("socket:[9001]")
    metrics = (fixtures / "vllm" / "metrics-0.32.0-idle.txt").read_text()
    asked: list[str] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics)
        return _vllm_api(request)

    settings = VllmSettings(base_url="http://127.0.0.1:18000", canary="never", oneshot_window_s=0, required=True)
    runtime = _runtime(tmp_path, pid=100)
    config = parse_config({"node": {"container": "vllm", "container_runtime": str(runtime)},
                           "paths": {"proc_root": str(root), "state_dir": str(tmp_path)}})  # fmt: skip
    boxed = replace(config.environment(), http_transport=httpx.MockTransport(vllm))
    result = VllmCheck(settings, boxed).run()
    assert result.status is Status.OK and "/health" in asked, result
    asked.clear()
    on_host = replace(boxed, container=None)
    result = VllmCheck(settings, on_host).run()
    assert result.status is Status.CRITICAL and "held by pid 100 of uid 4242" in result.findings[0].message
    assert asked == []


def test_two_nodes_on_different_images_are_a_version_skew_and_their_names_differ_freely() -> None:
    """The vllm_executor facts of two nodes' containers through the peer comparison (over HTTP, as the daemon asks)."""
    from test_compare_verdict import drift_findings, peer_compare

    def node(name: str, image: str) -> list[CheckResult]:
        facts = {"container.name": name, "container.image": image, "vllm_executor": "ray"}
        return [CheckResult("vllm_executor", Status.OK, "vLLM pid 1: ray executor", facts=facts)]

    same = {
        "dgx-a": node("vllm-head", "vllm/vllm-openai:v0.32.0"),
        "dgx-b": node("vllm-worker", "vllm/vllm-openai:v0.32.0"),
    }
    assert drift_findings(peer_compare("dgx-a", same)) == []
    skew = {"dgx-a": node("vllm", "vllm/vllm-openai:v0.32.0"), "dgx-b": node("vllm", "vllm/vllm-openai:v0.31.1")}
    found = drift_findings(peer_compare("dgx-a", skew))
    assert [(f.code, f.status) for f in found] == [("PEER_VERSION_SKEW", Status.WARNING)]
    assert "container.image" in found[0].message


def test_where_the_process_environment_is_unreadable_the_containers_config_env_is_read(tmp_path: Path) -> None:
    """nccl_env: the container's server has no readable /proc/<pid>/environ here (the laid-out tree has none), so
    the environment the container was created with, from inspect's Config.Env, is the one checked."""
    from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings

    root = tmp_path / "proc"
    _tree(root, "pid:[4026532456]")
    runtime = _runtime(tmp_path, pid=100)
    config = parse_config({"node": {"container": "vllm", "container_runtime": str(runtime)},
                           "paths": {"proc_root": str(root), "state_dir": str(tmp_path)}})  # fmt: skip
    settings = validate(NcclEnvSettings, {"env_file": str(tmp_path / "absent.sh")})
    result = NcclEnvCheck(settings, config.environment()).run()
    assert result.facts.get("nccl_env.NCCL_IB_HCA") == "mlx5_0", result
    assert result.facts.get("nccl_env.NCCL_SOCKET_IFNAME") == "lo"


def test_a_stopped_container_is_vllm_not_running_and_says_so(tmp_path: Path) -> None:
    """inspect says exited (State.Pid 0): the vllm check finds no process and names the container's status."""
    from msgspec.structs import replace

    from dgxdoctor.checks.vllm import VllmCheck, VllmSettings

    runtime = _runtime(tmp_path)
    runtime.write_text(
        runtime.read_text().replace(str(tmp_path / "inspect.json"), str(RECORDED / "inspect_exited.json"))
    )
    config = parse_config({"node": {"container": "vllm", "container_runtime": str(runtime), "role": "head"},
                           "paths": {"state_dir": str(tmp_path)}})  # fmt: skip

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    settings = VllmSettings(base_url="http://127.0.0.1:18000", canary="never", oneshot_window_s=0, required=True)
    env = replace(config.environment(), http_transport=httpx.MockTransport(refused))
    result = VllmCheck(settings, env).run()
    assert result.status is Status.CRITICAL, result
    assert "container vllm is not running (exited)" in " ".join(f.message for f in result.findings), result

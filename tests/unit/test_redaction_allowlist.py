"""Redaction by construction: the serving processes' environments and command lines, and the NCCL env file, are
shown in a bundle only where the name is known to be harmless (an unknown ``FOO_BAR`` is replaced,
``NCCL_IB_HCA`` kept); the shapes the deny list missed (``--api_key``, ``--hf_token``, a URL password with ``/``,
``OPENAI_KEY``, ``NCCL_SECRET_*``, ``*_PASSWORD_*``) are gone from the archive, from ``/state``, from ``check
--json`` and from the drift messages, which show a digest instead so a difference is still seen. vLLM's flags come
from the installed vLLM's parser (the shipped list is compared with it in
tests/integration/test_vllm_flags_real.py)."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from msgspec.structs import replace
from test_bundle import TOKEN, FakeRunner, members, planted_node, sources

from conftest import FIXTURES, run_cli
from dgxdoctor.bundle.build import build_bundle
from dgxdoctor.bundle.redact import Redactor
from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.compare import compare
from dgxdoctor.fleet.peers import validate_state
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.settings.daemon import Credentials
from dgxdoctor.sources.commands import CommandResult, run_command
from dgxdoctor.sources.redact import digest
from dgxdoctor.sources.serving_env import pick_serving_python
from dgxdoctor.sources.vllm_flags import shipped_flags, vllm_flags
from proctree import write_process
from webtest import TestClient, TestServer

# Each shape the deny list let through, planted once.
SHAPES = {
    "--api_key": "apiUnderscorePLANTED1",
    "--hf_token": "hfUnderscorePLANTED2",
    "URL password with a slash": "pa/ssPLANTED3",
    "OPENAI_KEY": "openaiPLANTED4",
    "NCCL_SECRET_*": "ncclSecretPLANTED5",
    "*_PASSWORD_*": "passwordMidPLANTED6",
    "unknown variable": "fooBarPLANTED7",
}


def plant_shapes(tmp: Path, python: str = "/opt/vllm/bin/python3") -> None:
    """A vLLM server with the shapes on its command line and in its environment, the env file and vLLM's log."""
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/glm", "--api_key",
        SHAPES["--api_key"], "--hf_token", SHAPES["--hf_token"], "--tensor-parallel-size", "2", "--port", "8000",
        "--served-model-name", f"postgres://u:{SHAPES['URL password with a slash']}@db",
    ]  # fmt: skip
    d = write_process(tmp / "proc", 5151, "python3", argv)
    (d / "environ").write_bytes(
        b"\0".join(
            s.encode()
            for s in (
                "NCCL_IB_HCA=mlx5_0",
                f"FOO_BAR={SHAPES['unknown variable']}",
                f"OPENAI_KEY={SHAPES['OPENAI_KEY']}",
                f"NCCL_SECRET_TOKEN_X={SHAPES['NCCL_SECRET_*']}",
                f"PG_PASSWORD_PLAIN={SHAPES['*_PASSWORD_*']}",
                f"RAY_ADDRESS=postgres://u:{SHAPES['URL password with a slash']}@h",
                "CUDA_VISIBLE_DEVICES=0,1",
            )
        )
    )
    with (tmp / "nccl.sh").open("a") as fh:
        fh.write(f"export NCCL_SECRET_FOO={SHAPES['NCCL_SECRET_*']}\nexport NCCL_IB_GID_INDEX=3\n")
    with (tmp / "vllm.log").open("a") as fh:
        fh.write(
            f"INFO args: vllm serve /m --api_key {SHAPES['--api_key']} --hf_token={SHAPES['--hf_token']}\n"
            f"INFO db postgres://u:{SHAPES['URL password with a slash']}@h:5432/x\n"
            f"INFO env: OPENAI_KEY={SHAPES['OPENAI_KEY']} NCCL_SECRET_FOO={SHAPES['NCCL_SECRET_*']}\n"
            f"INFO PG_PASSWORD_PLAIN: {SHAPES['*_PASSWORD_*']} max_tokens=16\n"
        )


def test_each_shape_is_gone_from_the_bundle_and_harmless_names_stay(tmp_path: Path) -> None:
    config = planted_node(tmp_path)
    plant_shapes(tmp_path)
    env = replace(config.environment(), run_command=FakeRunner())
    out = tmp_path / "b.tar.gz"
    build_bundle(config, env, sources(), out, 30.0, (), "dgxdoctor bundle")
    files = members(out)
    everything = b"\n".join(files.values())
    assert {kind: v for kind, v in SHAPES.items() if v.encode() in everything} == {}
    assert b"PLANTED" not in everything
    nccl = files["b/dgx-b/nccl-env.txt"].decode()
    lines = set(nccl.splitlines())
    # The allow list: an unknown variable is replaced, NCCL's and CUDA's configuration kept.
    assert "FOO_BAR=<redacted>" in lines and "NCCL_IB_HCA=mlx5_0" in lines and "CUDA_VISIBLE_DEVICES=0,1" in lines
    assert "OPENAI_KEY=<redacted>" in lines and "NCCL_SECRET_TOKEN_X=<redacted>" in lines
    assert "PG_PASSWORD_PLAIN=<redacted>" in lines and "RAY_ADDRESS=postgres://u:<redacted>@h" in lines
    # The env file by its variables: NCCL's kept, a secret-named NCCL_* not.
    assert "NCCL_SOCKET_IFNAME=ens1f0" in lines and "NCCL_SECRET_FOO=<redacted>" in lines
    assert "NCCL_IB_GID_INDEX=3" in lines
    # The command line: vLLM's own harmless flags kept (its parser's list), secret-named ones never.
    cmd = next(line for line in lines if line.startswith("# pid 5151"))
    assert "--model /models/glm" in cmd and "--tensor-parallel-size 2 --port 8000" in cmd
    assert "--api_key <redacted> --hf_token <redacted>" in cmd
    log = files["b/dgx-b/logs/vllm/vllm.log"].decode()
    assert "--api_key <redacted> --hf_token=<redacted>" in log and "postgres://u:<redacted>@h:5432/x" in log
    assert "max_tokens=16" in log


def test_the_flags_come_from_the_serving_pythons_vllm_when_it_answers(tmp_path: Path) -> None:
    """A flag only the running vLLM's parser knows is kept; one it knows whose name looks secret is not."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    flags = {"--brand-new-flag": True, "--model": True, "--hf-token": True, "--api-key": True}
    python.write_text(f"#!{sys.executable}\nprint('INFO vllm is loading')\nprint({json.dumps({'flags': flags})!r})\n")
    python.chmod(0o755)
    config = planted_node(tmp_path)
    plant_shapes(tmp_path, str(python))
    (tmp_path / "proc" / "5151" / "exe").symlink_to(python)
    (tmp_path / "proc" / "5151" / "cmdline").write_bytes(
        b"\0".join(a.encode() for a in (str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
                                        "--brand-new-flag", "kept", "--hf-token", SHAPES["--hf_token"], ""))
    )  # fmt: skip
    fake = FakeRunner()

    def runner(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        return run_command(argv, timeout_s) if argv[0] == str(python) else fake(argv, timeout_s)

    env = replace(config.environment(), run_command=runner)
    out = tmp_path / "b.tar.gz"
    build_bundle(config, env, sources(), out, 30.0, (), "dgxdoctor bundle")
    nccl = members(out)["b/dgx-b/nccl-env.txt"].decode()
    assert "--brand-new-flag kept --hf-token <redacted>" in nccl
    assert SHAPES["--hf_token"] not in nccl


# The env file and the raylet's environment differ in harmless and secret-named NCCL variables.
FILE_SECRETS = {"NCCL_SECRET_TOKEN": "fileSecretPLANTED8", "NCCL_NET_PASSWORD_FILE": "filePassPLANTED9"}
PROC_SECRETS = {"NCCL_SECRET_TOKEN": "procSecretPLANTED10", "NCCL_NET_PASSWORD_FILE": "procPassPLANTED11"}


def drift_node(tmp: Path, secrets: dict[str, str], ifname: str = "bond0") -> tuple[Path, Path]:
    """The tutorial's env file plus the secrets, and a raylet started from an older copy of it."""
    text = (FIXTURES / "nccl_env" / "nccl.sh").read_text().replace("192.168.10.11", "127.0.0.1")
    env_file = tmp / "nccl.sh"
    env_file.write_text(text + "".join(f"export {k}={v}\n" for k, v in FILE_SECRETS.items()))
    values = {
        "NCCL_IB_HCA": "mlx5_0,mlx5_2", "NCCL_IB_GID_INDEX": "3", "NCCL_SOCKET_IFNAME": ifname,
        "GLOO_SOCKET_IFNAME": "bond0", "NCCL_NET_GDR_LEVEL": "SYS", "NCCL_DEBUG": "WARN",
        "NCCL_DEBUG_SUBSYS": "INIT,NET", "VLLM_HOST_IP": "127.0.0.1", **secrets,
    }  # fmt: skip
    d = write_process(tmp / "proc", 4242, "raylet", ["/opt/ray/bin/raylet", "--node_ip_address=127.0.0.1"])
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in values.items()))
    return env_file, tmp / "proc"


def assert_drift_redacted(text: str) -> None:
    for value in (*FILE_SECRETS.values(), *PROC_SECRETS.values()):
        assert value not in text
    assert "PLANTED" not in text


def test_check_json_drift_message_shows_digests_not_values(tmp_path: Path) -> None:
    env_file, proc = drift_node(tmp_path, PROC_SECRETS)
    config = tmp_path / "config.toml"
    config.write_text(
        f'node = "dgx-a"\n[paths]\nsysfs_root = "{FIXTURES / "nccl_env" / "sysfs"}"\nproc_root = "{proc}"\n'
        f'state_dir = "{tmp_path}"\n[checks.nccl_env]\nenv_file = "{env_file}"\nprocess_name = "raylet"\n'
    )
    done = run_cli("check", "--config", str(config), "--only", "nccl_env", "--json")
    assert_drift_redacted(done.stdout + done.stderr)
    check = done.json()["checks"][0]
    drift = {f["subject"]: f["message"] for f in check["findings"] if f["code"] == "NCCL_ENV_DRIFT"}
    secret, password = "NCCL_SECRET_TOKEN", "NCCL_NET_PASSWORD_FILE"
    assert drift[secret] == (
        f"{secret} is {digest(FILE_SECRETS[secret])} in {env_file} but {digest(PROC_SECRETS[secret])} in "
        "raylet (pid 4242)"
    )
    assert digest(FILE_SECRETS[password]) in drift[password] and digest(PROC_SECRETS[password]) in drift[password]
    assert set(drift) == {secret, password}  # the harmless ones agree
    assert done.json()["facts"]["nccl_env.NCCL_SECRET_TOKEN"] == digest(PROC_SECRETS[secret])


async def test_state_page_and_metrics_drift_shows_digests_not_values(tmp_path: Path) -> None:
    env_file, proc = drift_node(tmp_path, PROC_SECRETS, ifname="eth")
    env = Environment(node="dgx-a", sysfs_root=FIXTURES / "nccl_env" / "sysfs", proc_root=proc, state_dir=tmp_path)
    settings = NcclEnvSettings(env_file=env_file, process_name="raylet")
    result = NcclEnvCheck(settings, env, addresses=lambda: {"127.0.0.1"}).run()
    drift = {f.subject: f.message for f in result.findings if f.code == "NCCL_ENV_DRIFT"}
    # A harmless name is quoted as it is: the operator sees what to fix.
    assert drift["NCCL_SOCKET_IFNAME"] == f"NCCL_SOCKET_IFNAME is 'bond0' in {env_file} but 'eth' in raylet (pid 4242)"
    store = ResultStore("dgx-a", clock=lambda: 1_700_000_000.0)
    store.put(result)

    async def reload() -> list[str]:
        return []

    state = AppState(store, make_registry(store), lambda: {"healthy": True}, Credentials(read=TOKEN), reload)
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(state), host="127.0.0.1"))
    await client.start_server()
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/state", "/", "/metrics"):
            resp = await client.get(path, headers=auth)
            assert resp.status == 200, path
            assert_drift_redacted(await resp.text())
        assert digest(PROC_SECRETS["NCCL_SECRET_TOKEN"]) in await (await client.get("/state", headers=auth)).text()
    finally:
        await client.close()


def test_the_nodes_drift_shows_that_a_secret_named_value_differs_without_it(tmp_path: Path) -> None:
    """Two nodes whose NCCL_SECRET_TOKEN differ: the comparison (through the peer validation the daemon uses) says
    so with the two digests; before, both read "<redacted>" and the difference was lost."""
    docs = []
    for node, secrets in (("dgx-a", FILE_SECRETS), ("dgx-b", PROC_SECRETS)):
        root = tmp_path / node
        root.mkdir()
        _, proc = drift_node(root, secrets)
        env = Environment(node=node, sysfs_root=FIXTURES / "nccl_env" / "sysfs", proc_root=proc, state_dir=root)
        result = NcclEnvCheck(NcclEnvSettings(env_file=None, process_name="raylet"), env, lambda: {"127.0.0.1"}).run()
        docs.append(validate_state(json.loads(json.dumps(ResultsDocument.of(node, [result]).state()))))
    findings = [f for f in compare(docs).findings if f.code == "PEER_NCCL_ENV_DRIFT"]
    assert_drift_redacted(" ".join(f.message for f in findings))
    token = next(f.message for f in findings if "nccl_env.NCCL_SECRET_TOKEN" in f.message)
    assert digest(FILE_SECRETS["NCCL_SECRET_TOKEN"]) in token and digest(PROC_SECRETS["NCCL_SECRET_TOKEN"]) in token


def test_old_agents_raw_value_is_shown_as_a_digest(tmp_path: Path) -> None:
    """A peer of an older release sends an unknown NCCL variable's value raw: the message quotes its digest."""
    docs = [
        validate_state(ResultsDocument.of(node, [CheckResult("nccl_env", Status.OK, "ok", facts=facts)]).state())
        for node, facts in (
            ("dgx-a", {"nccl_env.NCCL_SECRET_X": digest("one")}),
            ("dgx-b", {"nccl_env.NCCL_SECRET_X": "twoPLANTED12"}),
        )
    ]
    findings = [f for f in compare(docs).findings if f.code == "PEER_NCCL_ENV_DRIFT"]
    assert len(findings) == 1 and "twoPLANTED12" not in findings[0].message
    assert digest("twoPLANTED12") in findings[0].message


def test_a_vllm_command_line_in_state_keeps_only_known_flag_values(tmp_path: Path) -> None:
    """vLLM down: the finding quotes its command line; a flag vLLM's parser does not know has its value replaced,
    as does a URL's password with a slash in it where the serving Python is named (before: both as they were)."""
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "vllm" / "proc", root)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--db", "plainPLANTED13", "--port", "18765"]
    (root / "7538" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    env = Environment(node="n1", proc_root=root, http_transport=httpx.MockTransport(refused))
    result = VllmCheck(VllmSettings(base_url="http://127.0.0.1:18765", canary="never"), env).run()
    state = json.dumps(ResultsDocument.of("n1", [result]).state())
    assert "PLANTED" not in state
    assert "api_server --db <redacted> --port 18765) exists" in state
    python = "/opt/vllm/bin/python3"
    argv = [python, "-m", "vllm", "serve", "/m", "--api_key", SHAPES["--api_key"], "--served-model-name",
            f"postgres://u:{SHAPES['URL password with a slash']}@h"]  # fmt: skip
    found = pick_serving_python([(python, argv)])
    assert found is not None and "PLANTED" not in found.why
    assert found.why.endswith("serve /m --api_key <redacted> --served-model-name postgres://u:<redacted>@h")


@pytest.mark.parametrize("unit", ["a://x:", "a://", "x:y@", "a a", '"a":', "_-a", "--a b ", "hf_"])
def test_the_deny_list_costs_time_linear_in_a_log_tail(unit: str) -> None:
    """A password to the last "@" must not mean a scan to the end of the word from every "://": a log line of
    `a://x:` repeated cost 21 ms per KiB at 8 KiB with a backtracking pattern (and growing with the line)."""
    redactor = Redactor(["daemon-token-0123456789"])

    def per_kib(size: int) -> float:
        text = "INFO " + unit * (size // len(unit))
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            redactor.text(text)
            best = min(best, time.perf_counter() - t0)
        return best / (len(text) / 1024)

    # 5 ms per KiB is 20x what any shape costs here (0.2-0.4 ms), and a shared machine's noise stays below it.
    short, long = per_kib(4096), per_kib(32768)
    assert long <= max(5e-3, 4 * short), f"{short * 1e6:.0f} -> {long * 1e6:.0f} us/KiB"


def test_a_probe_stuck_past_its_timeout_leaves_the_shipped_list_and_is_not_repeated() -> None:
    """Importing vLLM may hang in the kernel (a GPU off the bus) where no kill reaches it: the bundle still gets
    vLLM's flags (the shipped list) within the probe's time, and no second probe of that interpreter piles up."""
    release = threading.Event()
    calls: list[list[str]] = []

    def stuck(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        calls.append(list(argv))
        release.wait(30)  # past its own timeout, as a process in D state is
        return CommandResult(tuple(argv), 0, json.dumps({"flags": {"--late": True}}), "")

    python = "/opt/stuck-vllm/bin/python3"
    t0 = time.monotonic()
    assert vllm_flags(python, stuck, 0.5) == shipped_flags()
    assert time.monotonic() - t0 < 3.0
    assert vllm_flags(python, stuck, 0.5) == shipped_flags() and len(calls) == 1
    release.set()

"""Secrets that dgxdoctor reads never leave it: vLLM's ``--api-key`` in a quoted command line, a line of the NCCL
env file that is not an assignment (it may carry a token), a secret-named variable among the NCCL facts on the
open ``/metrics``. Each is checked where an operator or a stranger would see it: ``/state``, ``check --json``,
``/metrics``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
from prometheus_client import generate_latest

from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources import nccl_env
from dgxdoctor.sources.redact import digest
from dgxdoctor.sources.serving_env import pick_serving_python

SECRET = "sk-3f9c1d2e8b7a6f5e"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_vllm_api_key_never_in_state_when_vllm_is_down(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "vllm" / "proc", root)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--api-key", SECRET, "--port", "18765"]
    (root / "7538" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    env = Environment(node="n1", proc_root=root, http_transport=httpx.MockTransport(refused))
    result = VllmCheck(VllmSettings(base_url="http://127.0.0.1:18765", canary="never"), env).run()
    state = json.dumps(ResultsDocument.of("n1", [result]).state())
    assert "process 7538" in state and "--api-key <redacted>" in state
    assert SECRET not in state


def test_argv_secrets_are_redacted_and_nothing_else() -> None:
    from dgxdoctor.sources.redact import redact_argv, secret_name

    argv = ["vllm", "serve", "/m", "--api-key=k1", "--hf-token", "k2", "HF_TOKEN=k3", "--tokenizer", "/tok"]
    assert redact_argv(argv) == (
        "vllm",
        "serve",
        "/m",
        "--api-key=<redacted>",
        "--hf-token",
        "<redacted>",
        "HF_TOKEN=<redacted>",
        "--tokenizer",
        "/tok",
    )
    assert not secret_name("max-num-batched-tokens") and secret_name("AWS_SECRET_ACCESS_KEY")
    found = pick_serving_python([("/opt/vllm/bin/python3", ["/opt/vllm/bin/python3", "-m", "vllm", "--api-key", "k"])])
    assert found is not None and "k" not in found.why.split()


def test_a_non_assignment_line_of_the_env_file_is_reported_by_number_and_kind_only(tmp_path: Path) -> None:
    env_file = tmp_path / "nccl.sh"
    env_file.write_text(
        f'export NCCL_SOCKET_IFNAME=lo\n[ -f /etc/hf ] && export HF_TOKEN={SECRET}\nexport X="$(cat /run/{SECRET})"\n'
        f"set -e\nprintf {SECRET}\n"
    )
    (tmp_path / "proc").mkdir()
    env = Environment(node="n1", sysfs_root=tmp_path / "sys", proc_root=tmp_path / "proc", state_dir=tmp_path)
    result = NcclEnvCheck(NcclEnvSettings(env_file=env_file), env, addresses=lambda: {"127.0.0.1"}).run()
    report = json.dumps(ResultsDocument.of("n1", [result]).report())
    assert SECRET not in report
    lines = {f.subject: f.message for f in result.findings if f.code == "NCCL_ENV_FILE_LINE"}
    assert lines[f"{env_file}:2"] == "line 2: not a plain assignment (a conditional or a command list), ignored"
    assert lines[f"{env_file}:3"] == "line 3: X: command substitution is not evaluated (value kept as text)"
    assert lines[f"{env_file}:4"] == "line 4: not a plain assignment (sets shell options), ignored"
    assert lines[f"{env_file}:5"] == "line 5: not a plain assignment (a command), ignored"


def test_nccl_facts_on_the_open_metrics_keep_configuration_and_hide_secret_named_values() -> None:
    """NCCL_* values are configuration both nodes must share (the comparison needs them); one whose name is not
    known to be harmless is shown as a digest, and no other variable of vLLM's environment is a fact at all."""
    values = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_NET_PLUGIN_API_KEY": SECRET, "HF_TOKEN": SECRET, "PATH": "/bin"}
    facts = nccl_env.env_facts(values)
    assert facts == {"nccl_env.NCCL_IB_HCA": "mlx5_0,mlx5_1", "nccl_env.NCCL_NET_PLUGIN_API_KEY": digest(SECRET)}
    store = ResultStore("n1", clock=lambda: 1.0)
    store.put(CheckResult("nccl_env", Status.OK, "ok", facts=facts))
    exposition = generate_latest(make_registry(store)).decode()
    assert "mlx5_0,mlx5_1" in exposition and SECRET not in exposition

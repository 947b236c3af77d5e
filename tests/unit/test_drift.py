"""The drift check's facts: kernel, serving-stack versions (from the serving python), model fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from dgxdoctor.checks.drift import DriftCheck, DriftSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult
from dgxdoctor.sources.fingerprint import (
    Entry,
    ShardHasher,
    listing_fingerprint,
    sample_shards,
    scan_model_dir,
)
from dgxdoctor.sources.serving_env import (
    PROBE,
    _interpreter,
    find_serving_python,
    parse_probe_output,
    pick_serving_python,
    trusted_process,
)
from proctree import write_process

VERSIONS = {
    "python_version": "3.12.3",
    "vllm_version": "0.32.0",
    "ray_version": "2.60.0",
    "torch_version": "2.11.0+cu130",
    "nccl_version": "2.28.9",
}


class Runner:
    def __init__(self, stdout: str = json.dumps(VERSIONS), returncode: int = 0, missing: bool = False) -> None:
        self.stdout, self.returncode, self.missing = stdout, returncode, missing
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        self.calls.append(list(argv))
        if self.missing:
            raise CommandNotFound(f"{argv[0]} not found")
        return CommandResult(tuple(argv), self.returncode, self.stdout, "boom" if self.returncode else "")


def proc_root(tmp_path: Path, release: str = "6.18.44") -> Path:
    root = tmp_path / "proc"
    (root / "sys/kernel").mkdir(parents=True)
    (root / "sys/kernel/osrelease").write_text(release + "\n")
    return root


def model_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models" / "glm"
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"num_attention_heads": 64}')
    for i in range(1, 6):
        (root / f"model-{i:05d}-of-00005.safetensors").write_bytes(bytes([i]) * (1000 + i))
    (root / ".cache").mkdir()
    (root / ".cache" / "lock").write_text("differs per node")
    return root


def test_facts_and_info_samples(tmp_path: Path) -> None:
    runner = Runner()
    env = Environment(proc_root=proc_root(tmp_path), run_command=runner)
    settings = DriftSettings(serving_python="/opt/vllm/bin/python", model_dir=model_dir(tmp_path))
    result = DriftCheck(settings, env).run()
    assert result.status is Status.OK
    assert runner.calls == [["/opt/vllm/bin/python", "-I", "-c", PROBE]]
    assert result.facts["kernel_release"] == "6.18.44"
    for key, value in VERSIONS.items():
        assert result.facts[key] == value
    assert len(result.facts["model_fingerprint"]) == 16
    assert result.facts["model_files"] == "6"
    node_info = next(s for s in result.samples if s.metric.name == "dgxdoctor_node_info")
    assert node_info.value == 1 and node_info.labels["vllm_version"] == "0.32.0"
    assert node_info.labels["kernel_release"] == "6.18.44"
    model_info = next(s for s in result.samples if s.metric.name == "dgxdoctor_model_info")
    assert model_info.labels == {"model_dir": str(settings.model_dir), "fingerprint": result.facts["model_fingerprint"]}
    assert not any(k.startswith("model_shard_sha256.") for k in result.facts)  # 0 shards by default


def test_nothing_to_read_is_ok_with_unknowns(tmp_path: Path) -> None:
    env = Environment(proc_root=tmp_path / "noproc", run_command=Runner())
    result = DriftCheck(DriftSettings(), env).run()
    assert result.status is Status.OK
    codes = {f.code for f in result.findings}
    assert {"SERVING_PYTHON_UNKNOWN", "MODEL_DIR_UNKNOWN", "DRIFT_UNKNOWN"} <= codes
    assert "vllm_version" not in result.facts and "kernel_release" not in result.facts
    node_info = next(s for s in result.samples if s.metric.name == "dgxdoctor_node_info")
    assert node_info.labels["vllm_version"] == ""


@pytest.mark.parametrize(
    "runner",
    [Runner(missing=True), Runner(returncode=1), Runner(stdout="Traceback ..."), Runner(stdout="[1, 2]")],
)
def test_probe_failures_are_unknown_not_errors(tmp_path: Path, runner: Runner) -> None:
    env = Environment(proc_root=proc_root(tmp_path), run_command=runner)
    result = DriftCheck(DriftSettings(serving_python="/x/python"), env).run()
    assert result.status is Status.OK
    assert "SERVING_PYTHON_UNKNOWN" in {f.code for f in result.findings}
    assert "vllm_version" not in result.facts


def test_serving_python_found_from_processes(tmp_path: Path) -> None:
    runner = Runner()
    root = proc_root(tmp_path)
    env = Environment(proc_root=root, run_command=runner)
    write_process(root, 10, "bash", ["bash"], exe="/usr/bin/bash")
    write_process(root, 11, "ray::RayWorkerW", ["ray::RayWorkerWrapper"], exe="/opt/ray/bin/python3.12")
    vllm_argv = ["/opt/vllm/bin/python3", "/opt/vllm/bin/vllm", "serve", "/models/glm"]
    write_process(root, 12, "vllm", vllm_argv, exe="/opt/vllm/bin/python3")
    DriftCheck(DriftSettings(), env).run()
    assert runner.calls[0][0] == "/opt/vllm/bin/python3"
    (root / "12" / "cmdline").write_bytes(b"")  # it exited: the Ray worker's interpreter is next
    found = find_serving_python(root)
    assert found is not None and found.exe == "/opt/ray/bin/python3.12"
    others = [
        ("/usr/bin/python3", ["/usr/bin/python3", "-m", "pytest", "tests/integration/test_vllm_real.py"]),
        ("/opt/vllm/bin/python3", ["/opt/vllm/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]),
    ]
    found = pick_serving_python(others)
    assert found is not None and found.exe == "/opt/vllm/bin/python3"
    ray_worker = [
        (
            "/opt/ray/bin/python",
            ["/opt/ray/bin/python", "/opt/ray/lib/python3.11/site-packages/ray/_private/workers/default_worker.py"],
        )
    ]
    assert pick_serving_python(ray_worker) is not None


def test_serving_python_of_another_user_is_not_run(tmp_path: Path) -> None:
    root = proc_root(tmp_path)
    argv = ["/home/eve/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    write_process(root, 20, "python3", argv, exe="/home/eve/venv/bin/python3", uid=4242)
    assert find_serving_python(root, agent_uid=1000) is None
    write_process(root, 21, "python3", argv, exe="/opt/vllm/bin/python3", uid=0)  # root's: trusted
    found = find_serving_python(root, agent_uid=1000)
    assert found is not None and found.exe == "/opt/vllm/bin/python3"
    assert found.why.startswith("running vLLM process: /home/eve/venv/bin/python3 -m vllm")


def test_only_processes_of_the_agent_user_or_root_are_trusted() -> None:
    assert trusted_process(1000, agent_uid=1000)
    assert trusted_process(0, agent_uid=1000)
    assert not trusted_process(4242, agent_uid=0)
    assert not trusted_process(None, agent_uid=0)


def test_venv_interpreter_path_is_kept(tmp_path: Path) -> None:
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(os.path.realpath("/bin/sh"))
    argv = [str(venv_python), "-m", "vllm.entrypoints.openai.api_server"]
    assert _interpreter("/usr/bin/python3.11", argv) == str(venv_python)
    assert _interpreter("/usr/bin/python3.11", ["python3", "-m", "vllm"]) == "/usr/bin/python3.11"


def test_missing_model_dir_is_a_warning(tmp_path: Path) -> None:
    env = Environment(proc_root=proc_root(tmp_path), run_command=Runner())
    settings = DriftSettings(serving_python="/x/python", model_dir=tmp_path / "models" / "absent")
    result = DriftCheck(settings, env).run()
    assert result.status is Status.WARNING
    assert result.facts["model_fingerprint"] == "missing"


def test_fingerprint_stable_and_sensitive_to_a_size_change(tmp_path: Path) -> None:
    root = model_dir(tmp_path)
    first = listing_fingerprint(scan_model_dir(root))
    assert listing_fingerprint(scan_model_dir(root)) == first
    assert listing_fingerprint(reversed(scan_model_dir(root))) == first  # order of discovery does not matter
    os.utime(root / "config.json", (0, 0))  # mtimes differ between copies and must not matter
    assert listing_fingerprint(scan_model_dir(root)) == first
    with (root / "model-00003-of-00005.safetensors").open("ab") as fh:
        fh.write(b"x")
    assert listing_fingerprint(scan_model_dir(root)) != first
    (root / "model-00003-of-00005.safetensors").rename(root / "renamed.safetensors")
    assert listing_fingerprint(scan_model_dir(root)) != first


def test_shard_sample_is_deterministic() -> None:
    entries = [Entry(f"model-{i:05d}.safetensors", 1) for i in range(1, 11)] + [Entry("config.json", 2)]
    assert sample_shards(entries, 0) == []
    assert [e.name for e in sample_shards(entries, 1)] == ["model-00001.safetensors"]
    assert [e.name for e in sample_shards(entries, 2)] == ["model-00001.safetensors", "model-00010.safetensors"]
    assert len(sample_shards(entries, 3)) == 3
    assert len(sample_shards(entries, 50)) == 10


def test_shard_hashes_complete_over_runs_within_budget(tmp_path: Path) -> None:
    root = model_dir(tmp_path)
    runner = Runner()
    env = Environment(proc_root=proc_root(tmp_path), run_command=runner)
    settings = DriftSettings(serving_python="/x/python", model_dir=root, sample_shards=2, hash_bytes_per_run=1500)
    check = DriftCheck(settings, env)
    first = check.run()
    assert "MODEL_SHARDS_HASHING" in {f.code for f in first.findings}
    done = check.run()
    for name in ("model-00001-of-00005.safetensors", "model-00005-of-00005.safetensors"):
        expected = hashlib.sha256((root / name).read_bytes()).hexdigest()
        assert done.facts[f"model_shard_sha256.{name}"] == expected
    assert "MODEL_SHARDS_HASHING" not in {f.code for f in done.findings}


def test_hasher_restarts_when_file_changes(tmp_path: Path) -> None:
    shard = tmp_path / "a.safetensors"
    shard.write_bytes(b"a" * 100)
    hasher = ShardHasher()
    assert hasher.advance([shard], 60)[str(shard)] is None
    shard.write_bytes(b"b" * 120)
    assert hasher.advance([shard], 1000)[str(shard)] == hashlib.sha256(b"b" * 120).hexdigest()


def test_probe_script_runs_in_a_real_interpreter() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30, check=True)
    facts = parse_probe_output(done.stdout)
    assert facts["python_version"].count(".") == 2
    assert "vllm_version" not in facts  # the agent's venv has no vLLM


def test_probe_output_from_the_h200_machine() -> None:
    stdout = (Path(__file__).resolve().parents[1] / "fixtures" / "drift" / "h200_probe_stdout.json").read_text()
    expected = {"python_version": "3.12.3", "torch_version": "2.11.0", "nccl_version": "2.28.9"}
    assert parse_probe_output(stdout) == expected


def test_summary_names_what_is_known_and_what_is_missing_and_why(tmp_path: Path) -> None:
    from dgxdoctor.checks.drift import DriftCheck, DriftSettings
    from dgxdoctor.environment import Environment

    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/osrelease").write_text("6.1.0-28-amd64\n")
    summary = DriftCheck(DriftSettings(), Environment(proc_root=tmp_path)).run().summary
    assert summary.startswith("known: kernel_release 6.1.0-28-amd64; missing: vllm_version")
    assert "(no serving_python configured and no running vLLM or Ray Python process found)" in summary


def test_neither_dgxdoctor_nor_a_mention_of_ray_is_the_serving_python(tmp_path: Path) -> None:
    """#25: dgxdoctor's own Python (``dgxdoctor check --skip vllm``) and any argv holding "ray" were taken for the
    serving stack; only what a process runs counts (its -m module or script), never a later argument."""
    root = proc_root(tmp_path)
    dgx = "/opt/dgxdoctor/bin/python3"
    write_process(root, 30, "dgxdoctor", [dgx, "/opt/dgxdoctor/bin/dgxdoctor", "check", "--skip", "vllm"], exe=dgx)
    write_process(root, 31, "dgxdoctor", [dgx, "/opt/dgxdoctor/bin/dgxdoctor", "check", "--only", "ray"], exe=dgx)
    write_process(root, 32, "python3", ["/usr/bin/python3", "/srv/watch.py", "--for", "ray"], exe="/usr/bin/python3")
    write_process(root, 33, "python3", ["/usr/bin/python3", "-c", "import ray"], exe="/usr/bin/python3")
    me = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    write_process(root, os.getpid(), "python3", me, exe="/usr/bin/python3")  # the agent itself, whatever it runs
    assert find_serving_python(root) is None
    vllm = ["/opt/vllm/bin/python3", "-X", "faulthandler", "-m", "vllm.entrypoints.openai.api_server"]
    write_process(root, 40, "python3", vllm, exe="/opt/vllm/bin/python3")
    found = find_serving_python(root)
    assert found is not None and found.exe == "/opt/vllm/bin/python3"

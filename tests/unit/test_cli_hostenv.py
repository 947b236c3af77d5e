"""`dgxdoctor check --only host,nccl_env,topology --json` end to end, paths pointed at fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import FIXTURES, run_cli

CHECK_KEYS = {"name", "status", "summary", "findings", "action", "duration_s", "error"}
FINDING_KEYS = {"code", "status", "subject", "message"}


def setup(tmp_path: Path, required: list[str]) -> tuple[Path, dict[str, str]]:
    # nvidia-smi stand-in on PATH that prints the capture from the H200 test machine
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    capture = FIXTURES / "topo" / "h200_x2_driver580.txt"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nassert sys.argv[1:] == ['topo', '-m'], sys.argv\n"
        f"sys.stdout.write(open({str(capture)!r}).read())\n"
    )
    fake.chmod(0o755)
    # the tutorial's file, with an address this machine surely has
    env_file = tmp_path / "nccl.sh"
    env_file.write_text((FIXTURES / "nccl_env" / "nccl.sh").read_text().replace("192.168.10.11", "127.0.0.1"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    (tmp_path / "proc").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(
        f"""
node = "dgx-a"
[paths]
sysfs_root = "{FIXTURES / "nccl_env" / "sysfs"}"
proc_root = "{tmp_path / "proc"}"
state_dir = "{tmp_path}"

[checks.host]
model_dir = "{model}"
ray_log_dir = "{tmp_path / "ray"}"
root_path = "{tmp_path}"
disk_warn_free_percent = 0.0
disk_critical_free_percent = 0.0
memory_available_warn_percent = 0.0
required_processes = {required!r}

[checks.nccl_env]
env_file = "{env_file}"

[checks.topology]
expected_gpus = 2
"""
    )
    return config, {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_check_json_shape_and_exit_code(tmp_path: Path) -> None:
    config, env = setup(tmp_path, ["no-such-daemon-xyz"])
    done = run_cli("check", "--config", str(config), "--only", "host,nccl_env,topology", "--json", env=env)
    assert done.returncode == 2, done.stderr
    doc = done.json()
    assert doc["node"] == "dgx-a"
    assert doc["status"] == "critical"
    assert sorted(c["name"] for c in doc["checks"]) == ["host", "nccl_env", "topology"]
    for check in doc["checks"]:
        assert set(check) >= CHECK_KEYS, check
        assert check["error"] is None, check
        for finding in check["findings"]:
            assert set(finding) >= FINDING_KEYS
    by_name = {c["name"]: c for c in doc["checks"]}
    host = by_name["host"]
    assert host["status"] == "critical"
    assert [(f["code"], f["subject"]) for f in host["findings"]] == [("HOST_PROCESS_MISSING", "no-such-daemon-xyz")]
    assert host["action"]["kind"] == "investigate"
    assert by_name["topology"]["status"] == "ok"
    assert by_name["topology"]["summary"] == "2 GPUs, GPU-GPU links NV18, 0 NICs"
    nccl = by_name["nccl_env"]
    assert nccl["status"] == "ok", nccl
    assert doc["facts"]["nccl_env.NCCL_IB_HCA"] == "mlx5_0,mlx5_2"
    assert doc["facts"]["host_ip"] == "127.0.0.1"
    assert doc["facts"]["topology.gpu_links"] == "NV18"


def test_check_all_ok_exits_zero(tmp_path: Path) -> None:
    config, env = setup(tmp_path, [])
    done = run_cli("check", "--config", str(config), "--only", "host,nccl_env,topology", "--json", env=env)
    assert done.returncode == 0, done.stdout
    assert done.json()["status"] == "ok"


def test_topology_skipped_without_nvidia_smi(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, [])
    done = run_cli("check", "--config", str(config), "--only", "topology", "--json", env={"PATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    (check,) = done.json()["checks"]
    assert check["status"] == "skipped"
    assert check["summary"] == "nvidia-smi not installed: no NVIDIA driver here"

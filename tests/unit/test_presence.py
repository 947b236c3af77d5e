"""Broken must never read as OK: the node's declared role and the PCI bus decide whether absence is SKIPPED or
CRITICAL. The PCI tree is laid out under an injected sysfs root (tests/pcitree.py) and NVML fails at its seam."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli
from dgxdoctor.checks.gpu import GpuCheck, GpuSettings
from dgxdoctor.checks.infiniband import InfinibandCheck, InfinibandSettings
from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.checks.ray import RayCheck, RaySettings
from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment, Role
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult
from dgxdoctor.sources.nvml import NVML_ERROR_DRIVER_NOT_LOADED, NvmlError, NvmlLibraryNotFound, error_for_code
from dgxdoctor.sources.pci import mellanox_nics, nvidia_gpus, read_pci_devices
from dgxdoctor.validation import validate
from fake_nvml import NO_LIBRARY, FakeNvml, load_capture
from pcitree import build_pci_tree

H100 = "h100-hgx-8gpu-565.57.01.json"
# What PynvmlClient raises for nvmlInit -> NVML_ERROR_DRIVER_NOT_LOADED (sources/nvml.py).
DRIVER_NOT_LOADED = NvmlLibraryNotFound("NVIDIA driver not loaded (nvmlInit: Driver Not Loaded)", 9)
MISMATCH = error_for_code(18, "nvmlInit: RM has detected an NVML/RM version mismatch.")
DGX_GPU_BUS_IDS = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
]


def codes(result: CheckResult) -> dict[str, Status]:
    return {f.code: f.status for f in result.findings}


def no_commands(argv: Any, timeout_s: float = 10.0) -> CommandResult:
    raise CommandNotFound(argv[0])


def env(tmp_path: Path, role: Role | None = None, pci: str | None = None, fake: FakeNvml | None = None) -> Environment:
    sysfs = tmp_path / "sys"
    sysfs.mkdir(exist_ok=True)
    if pci is not None:
        build_pci_tree(sysfs, pci)
    (tmp_path / "proc").mkdir(exist_ok=True)
    nvml = fake if fake is not None else FakeNvml(load_capture(H100), init_error=NO_LIBRARY)
    return Environment(
        node="dgx-a",
        role=role,
        sysfs_root=sysfs,
        proc_root=tmp_path / "proc",
        state_dir=tmp_path / "state",
        nvml_factory=lambda: nvml,
        run_command=no_commands,
    )


# -- the PCI tree


def test_pci_tree_names_gpus_and_nics_and_leaves_out_switches_vga_and_vfs(tmp_path: Path) -> None:
    devices = read_pci_devices(build_pci_tree(tmp_path, "dgx_h100.txt"))
    assert devices is not None
    assert [d.address for d in nvidia_gpus(devices)] == DGX_GPU_BUS_IDS
    nics = mellanox_nics(devices)
    assert len(nics) == 10  # 8 InfiniBand rails + the dual-port storage NIC; its VF is left out
    assert nics[0].driver == "mlx5_core" and nics[0].rdma_devices == ("mlx5_0",)
    assert nvidia_gpus(devices)[0].bus_id == "0000:18:00"


def test_no_pci_tree_is_none(tmp_path: Path) -> None:
    assert read_pci_devices(tmp_path) is None


# -- gpu: the bus speaks, role or not


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (DRIVER_NOT_LOADED, "GPU_DRIVER_NOT_LOADED"),
        (MISMATCH, "GPU_DRIVER_MISMATCH"),
        (NO_LIBRARY, "GPU_NVML_MISSING"),
        (NvmlError("nvmlInit: Unknown Error", 999), "GPU_NVML_INIT_FAILED"),
    ],
)
def test_gpus_on_the_bus_without_nvml_are_critical_without_a_role(tmp_path: Path, error: NvmlError, code: str) -> None:
    fake = FakeNvml(load_capture(H100), init_error=error)
    result = GpuCheck(GpuSettings(), env(tmp_path, pci="dgx_h100.txt", fake=fake)).run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {code: Status.CRITICAL}
    assert "8 NVIDIA GPU(s) on the PCI bus (0000:18:00.0," in result.summary
    assert str(error) in result.summary
    assert result.action is not None and result.action.remedy
    # the driver comes back: the next run initialises NVML again and is healthy
    fake.init_error = None
    assert GpuCheck(GpuSettings(), env(tmp_path, fake=fake)).run().status is Status.OK


def test_driver_not_loaded_remedy_names_the_module(tmp_path: Path) -> None:
    fake = FakeNvml(load_capture(H100), init_error=DRIVER_NOT_LOADED)
    result = GpuCheck(GpuSettings(), env(tmp_path, pci="dgx_h100.txt", fake=fake)).run()
    assert result.action is not None and "modprobe nvidia" in result.action.remedy
    assert DRIVER_NOT_LOADED.code == NVML_ERROR_DRIVER_NOT_LOADED


def test_no_nvml_and_no_gpu_on_the_bus_is_skipped_without_a_role(tmp_path: Path) -> None:
    result = GpuCheck(GpuSettings(), env(tmp_path, pci="h200_vm.txt")).run()
    assert result.status is Status.CRITICAL  # the VM's two H200s are on the bus
    empty = tmp_path / "empty"
    empty.mkdir()
    result = GpuCheck(GpuSettings(), env(empty)).run()
    assert result.status is Status.SKIPPED
    assert result.summary.endswith("no NVIDIA GPU on the PCI bus")


@pytest.mark.parametrize("role", ["head", "worker"])
def test_a_role_requires_gpus(tmp_path: Path, role: Role) -> None:
    result = GpuCheck(GpuSettings(), env(tmp_path, role=role)).run()
    assert codes(result) == {"GPU_REQUIRED_MISSING": Status.CRITICAL}
    assert f"the {role} node needs 8 GPUs" in result.summary
    capture = load_capture(H100)
    capture["gpus"] = []
    result = GpuCheck(GpuSettings(), env(tmp_path, role=role, fake=FakeNvml(capture))).run()
    assert codes(result) == {"GPU_REQUIRED_MISSING": Status.CRITICAL}


def test_nvml_without_gpus_while_the_bus_has_them(tmp_path: Path) -> None:
    capture = load_capture(H100)
    capture["gpus"] = []
    result = GpuCheck(GpuSettings(), env(tmp_path, pci="dgx_h100.txt", fake=FakeNvml(capture))).run()
    assert codes(result) == {"GPU_NOT_VISIBLE": Status.CRITICAL}


def test_gpu_on_the_bus_that_nvml_does_not_list_is_named(tmp_path: Path) -> None:
    capture = load_capture(H100)
    del capture["gpus"][3]  # 0000:5d:00.0 did not come up
    result = GpuCheck(GpuSettings(), env(tmp_path, pci="dgx_h100.txt", fake=FakeNvml(capture))).run()
    assert result.status is Status.CRITICAL
    missing = [f for f in result.findings if f.code == "GPU_MISSING_FROM_NVML"]
    assert len(missing) == 1
    assert missing[0].subject == "0000:5d:00"
    assert "0000:5d:00.0" in missing[0].message and "8 on the bus, NVML sees 7" in missing[0].message
    assert "GPU_COUNT_MISMATCH" in codes(result)


def test_every_gpu_on_the_bus_seen_by_nvml_is_healthy(tmp_path: Path) -> None:
    fake = FakeNvml(load_capture(H100))
    result = GpuCheck(GpuSettings(), env(tmp_path, role="head", pci="dgx_h100.txt", fake=fake)).run()
    assert "GPU_MISSING_FROM_NVML" not in codes(result)


# -- infiniband: a NIC without an RDMA device is a driver problem


def ib(tmp_path: Path, role: Role | None = None, pci: str | None = None, **settings: Any) -> CheckResult:
    return InfinibandCheck(validate(InfinibandSettings, settings), env(tmp_path, role=role, pci=pci)).run()


def test_mellanox_nics_without_rdma_device_are_critical(tmp_path: Path) -> None:
    result = ib(tmp_path, pci="dgx_h100.txt")
    assert codes(result) == {"IB_DRIVER_NOT_LOADED": Status.CRITICAL}
    assert "10 Mellanox/NVIDIA NIC function(s) on the PCI bus (0000:1a:00.0," in result.summary
    assert result.action is not None and "modprobe mlx5_ib" in result.action.remedy


def test_mellanox_nics_without_a_driver_name_mlx5_core(tmp_path: Path) -> None:
    sysfs = build_pci_tree(tmp_path / "sys", "dgx_h100.txt")
    (sysfs / "bus/pci/devices/0000:1a:00.0/driver").unlink()
    result = ib(tmp_path)
    assert result.action is not None and "no driver bound to 0000:1a:00.0" in result.action.remedy
    assert "modprobe mlx5_core" in result.action.remedy


def test_no_rdma_and_no_nic_is_skipped_without_a_role_and_critical_with_one(tmp_path: Path) -> None:
    result = ib(tmp_path, pci="h200_vm.txt")
    assert result.status is Status.SKIPPED
    assert "no Mellanox NIC on the PCI bus" in result.summary
    result = ib(tmp_path, role="worker", expected_ports=8)
    assert codes(result) == {"IB_REQUIRED_MISSING": Status.CRITICAL}
    assert "the worker node needs 8 RDMA ports" in result.summary


# -- nccl_env: the role needs its environment file


def test_missing_nccl_env_file(tmp_path: Path) -> None:
    settings = NcclEnvSettings(env_file=tmp_path / "nccl.sh")
    assert NcclEnvCheck(settings, env(tmp_path)).run().status is Status.SKIPPED
    result = NcclEnvCheck(settings, env(tmp_path, role="head")).run()
    assert codes(result) == {"NCCL_ENV_MISSING": Status.CRITICAL}
    assert f"{tmp_path / 'nccl.sh'} absent" in result.summary


# -- vLLM and Ray: dead on a node whose role needs them is CRITICAL in a single run


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_dead_vllm_on_the_head_is_critical_in_one_run(tmp_path: Path) -> None:
    settings = VllmSettings(base_url=f"http://127.0.0.1:{closed_port()}", request_timeout_s=2)
    assert VllmCheck(settings, env(tmp_path)).run().status is Status.SKIPPED
    assert VllmCheck(settings, env(tmp_path, role="worker")).run().status is Status.SKIPPED
    result = VllmCheck(settings, env(tmp_path, role="head")).run()
    assert codes(result) == {"VLLM_DEAD": Status.CRITICAL}
    assert "the head node ([node] role) must serve it" in result.findings[0].message
    assert result.action is not None and "systemctl restart vllm" in result.action.remedy


def test_dead_ray_on_either_role_is_critical_in_one_run(tmp_path: Path) -> None:
    settings = RaySettings(dashboard_url=f"http://127.0.0.1:{closed_port()}", request_timeout_s=2)
    assert RayCheck(settings, env(tmp_path)).run().status is Status.SKIPPED
    head = RayCheck(settings, env(tmp_path, role="head")).run()
    assert "RAY_DASHBOARD_DOWN" in codes(head) and head.status is Status.CRITICAL
    worker = RayCheck(settings, env(tmp_path, role="worker")).run()
    assert codes(worker) == {"RAY_RAYLET_DOWN": Status.CRITICAL}


# -- config: [node] role


def test_node_table_and_the_older_node_string() -> None:
    config = parse_config({"node": {"name": "dgx-a", "role": "head"}})
    assert (config.node, config.role) == ("dgx-a", "head")
    assert config.environment().role == "head"
    older = parse_config({"node": "dgx-b"})
    assert (older.node, older.role) == ("dgx-b", None)


def test_bad_role_and_a_contradicting_ray_role_are_config_errors() -> None:
    with pytest.raises(ConfigError) as bad:
        parse_config({"node": {"role": "leader"}})
    assert bad.value.problems[0] == ("node", "Invalid enum value 'leader' - at `$.node.role`")
    with pytest.raises(ConfigError) as contradicts:
        parse_config({"node": {"role": "worker"}, "checks": {"ray": {"role": "head"}}})
    assert contradicts.value.problems[0][0] == "checks.ray.role"
    assert "contradicts node.role 'worker'" in contradicts.value.problems[0][1]


# -- the one-shot CLI, as an operator runs it


def write_config(tmp_path: Path, role: str | None, pci: str | None = None) -> Path:
    sysfs = tmp_path / "sys"
    sysfs.mkdir(exist_ok=True)
    if pci is not None:
        build_pci_tree(sysfs, pci)
    (tmp_path / "proc").mkdir(exist_ok=True)
    node = f'[node]\nname = "dgx-a"\nrole = "{role}"\n' if role else '[node]\nname = "dgx-a"\n'
    path = tmp_path / "config.toml"
    path.write_text(
        node + f'[paths]\nsysfs_root = "{sysfs}"\nproc_root = "{tmp_path / "proc"}"\nstate_dir = "{tmp_path}"\n'
        f'[checks.vllm]\nbase_url = "http://127.0.0.1:{closed_port()}"\nrequest_timeout_s = 2\n'
        f'[checks.ray]\ndashboard_url = "http://127.0.0.1:{closed_port()}"\nrequest_timeout_s = 2\n'
    )
    return path


def test_cli_head_with_vllm_and_ray_down_is_critical(tmp_path: Path) -> None:
    done = run_cli("check", "--config", str(write_config(tmp_path, "head")), "--only", "vllm,ray")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "dgxdoctor on dgx-a: CRITICAL (role head)"
    assert "VLLM_DEAD" in done.stdout and "RAY_DASHBOARD_DOWN" in done.stdout
    assert "remedy:" in done.stdout


def test_cli_without_a_role_says_nothing_was_required(tmp_path: Path) -> None:
    done = run_cli("check", "--config", str(write_config(tmp_path, None)), "--only", "vllm,ray")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == (
        "dgxdoctor on dgx-a: OK (no [node] role declared: nothing was required, 2 of 2 checks skipped)"
    )
    doc = run_cli("check", "--json", "--config", str(write_config(tmp_path, None)), "--only", "vllm")
    assert '"role": null' in doc.stdout and '"required": false' in doc.stdout


def test_cli_gpus_on_the_bus_without_a_driver_are_critical(tmp_path: Path) -> None:
    """The real NVML client: here (no driver) it cannot start; on a GPU machine it sees other GPUs than the tree."""
    done = run_cli("check", "--config", str(write_config(tmp_path, None, pci="dgx_h100.txt")), "--only", "gpu")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "0000:18:00.0" in done.stdout

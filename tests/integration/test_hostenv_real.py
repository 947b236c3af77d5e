"""host, nccl_env and topology against the real machine: real nvidia-smi, psutil, /sys and /proc."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.checks.host import HostCheck, HostSettings
from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.checks.topology import TopologyCheck, TopologySettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from dgxdoctor.sources.topo import parse_topo_matrix

pytestmark = pytest.mark.integration


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: this machine has no NVIDIA driver")
def test_topology_on_real_gpus(tmp_path: Path) -> None:
    result = TopologyCheck(TopologySettings(), Environment(state_dir=tmp_path)).run()
    assert result.status in (Status.OK, Status.WARNING, Status.CRITICAL), result.summary
    gpus = [s.value for s in result.samples if s.metric.name == "dgxdoctor_topology_gpus"]
    assert gpus and gpus[0] >= 1
    print(result.summary, dict(result.facts))


def test_topology_skipped_here_when_no_driver(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("nvidia-smi present: covered by test_topology_on_real_gpus")
    result = TopologyCheck(TopologySettings(), Environment(state_dir=tmp_path)).run()
    assert result.status is Status.SKIPPED


def test_host_on_this_machine(tmp_path: Path) -> None:
    result = HostCheck(HostSettings(root_path=tmp_path), Environment(state_dir=tmp_path)).run()
    assert result.error is None
    assert any(s.metric.name == "dgxdoctor_host_memory_total_bytes" for s in result.samples)


def test_nccl_env_reads_a_real_process_environment(tmp_path: Path) -> None:
    """A real child process started with NCCL variables; its /proc/<pid>/environ is read, compared with a file."""
    import subprocess
    import sys

    env_file = tmp_path / "nccl.sh"
    env_file.write_text("export NCCL_DEBUG=WARN\nexport NCCL_SOCKET_IFNAME=lo\n")
    script = tmp_path / "dgxdoctor_probe_target.py"
    script.write_text("import time\ntime.sleep(60)\n")
    child = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo"},
    )
    try:
        # Popen returns once exec began; the kernel fills /proc/<pid>/cmdline a moment later.
        cmdline = Path(f"/proc/{child.pid}/cmdline")
        deadline = time.monotonic() + 10
        while script.name.encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        settings = NcclEnvSettings(env_file=env_file, process_name="dgxdoctor_probe_target.py")
        result = NcclEnvCheck(settings, Environment(state_dir=tmp_path)).run()
    finally:
        child.terminate()
        child.wait(10)
    codes = {(f.code, f.subject) for f in result.findings}
    assert ("NCCL_ENV_DRIFT", "NCCL_DEBUG") in codes, result.summary
    assert ("NCCL_IFNAME_LOOPBACK", "NCCL_SOCKET_IFNAME") in codes
    assert result.summary.startswith(f"dgxdoctor_probe_target.py (pid {child.pid})")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: this machine has no NVIDIA driver")
def test_diagnose_real_output() -> None:
    import subprocess

    text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True).stdout
    assert parse_topo_matrix(text).gpus
    done = run_cli("diagnose", "--json", "-", stdin=text)
    assert done.json()["inputs"][0]["kind"] == "nvidia-smi-topo"

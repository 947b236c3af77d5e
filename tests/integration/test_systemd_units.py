"""The unit files pass ``systemd-analyze verify`` (stderr read too: an unknown key only warns) and keep the
settings the daemon relies on."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from dgxdoctor.sources.vllm_launch import parse_launch

pytestmark = pytest.mark.integration

UNITS = (
    "dgxdoctor.service",
    "ray-head.service",
    "ray-worker.service",
    "vllm.service",
    "vllm-head-mp.service",
    "vllm-worker-mp.service",
)
# Install locations in the units, replaced by stubs here: verify fails on a missing ExecStart binary.
BINARIES = {"/opt/dgxdoctor/bin/": ("dgxdoctor",), "/opt/vllm/bin/": ("ray", "vllm")}


def stage(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for names in BINARIES.values():
        for name in names:
            stub = bindir / name
            stub.write_text("#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for unit in UNITS:
        text = (REPO / "systemd" / unit).read_text()
        for prefix in BINARIES:
            text = text.replace(prefix, f"{bindir}/")
        (units / unit).write_text(text)
    return units


def verify(units: Path, *names: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    return subprocess.run(
        [tool, "verify", "--man=no", *(f"./{n}" for n in names)],
        cwd=units,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_units_verify_clean(tmp_path: Path) -> None:
    done = verify(stage(tmp_path), *UNITS)
    assert done.returncode == 0 and done.stderr.strip() == "" and done.stdout.strip() == "", done.stderr


def test_verify_catches_a_bad_key(tmp_path: Path) -> None:
    """Proves the check above can fail: an unknown key exits 0 and only warns on stderr."""
    units = stage(tmp_path)
    with (units / "dgxdoctor.service").open("a") as fh:
        fh.write("WatchdogSecs=30\n")
    done = verify(units, "dgxdoctor.service")
    assert "WatchdogSecs" in done.stderr


def test_dgxdoctor_unit_settings() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((REPO / "systemd" / "dgxdoctor.service").read_text())
    service = parser["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert int(service["WatchdogSec"]) >= 10 and service["Restart"] == "on-failure"
    assert service["ProtectSystem"] == "strict" and service["ProtectKernelLogs"] == "no"
    assert "CAP_SYSLOG" in service["CapabilityBoundingSet"]
    assert "MemoryMax" in service and "CPUQuota" in service
    text = (REPO / "systemd" / "dgxdoctor.service").read_text()
    assert "DeviceAllow=/dev/kmsg r" in text and "DeviceAllow=char-nvidia-frontend rw" in text
    for unit in ("ray-head.service", "ray-worker.service", "vllm.service", *MP_UNITS):
        assert "EnvironmentFile=/etc/nccl.env" in (REPO / "systemd" / unit).read_text()


MP_UNITS = ("vllm-head-mp.service", "vllm-worker-mp.service")


def test_mp_units_agree_on_the_layout() -> None:
    """vLLM's mp executor across nodes: the same layout flags on both, the rank and --headless differ; no Ray."""
    argv = {}
    for unit in MP_UNITS:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string((REPO / "systemd" / unit).read_text())
        argv[unit] = parser["Service"]["ExecStart"].split()
        assert "ray" not in parser["Unit"].get("Requires", "") + parser["Unit"].get("After", "")
    head, worker = argv.values()
    for flag in ("--nnodes", "--master-addr", "--master-port", "--tensor-parallel-size", "serve"):
        assert head[head.index(flag) + 1] == worker[worker.index(flag) + 1], flag
    assert head[head.index("--node-rank") + 1] == "0" and worker[worker.index("--node-rank") + 1] == "1"
    assert "--headless" in worker and "--headless" not in head and "--port" not in worker
    layouts = [parse_launch(1, [a.replace("${HEAD_ADDR}", "10.0.0.1") for a in v]) for v in (head, worker)]
    assert all(launch.multi_node_mp for launch in layouts)


def test_nccl_env_file_has_no_export_lines() -> None:
    """systemd reads "export KEY=V" as the invalid name "export KEY" and drops it: plain KEY=VALUE only."""
    for line in (REPO / "systemd" / "nccl.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key.isidentifier() and key.isupper() and value, line


def test_every_kept_capability_is_explained() -> None:
    """Least privilege: each capability in the bounding set has its reason in a comment; CAP_KILL is not kept (the
    default remediation actions go through systemctl, which signals nothing itself)."""
    text = (REPO / "systemd" / "dgxdoctor.service").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("CapabilityBoundingSet=")]
    kept = line.split("=", 1)[1].split()
    assert "CAP_KILL" not in kept and "CAP_SYS_ADMIN" not in kept
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    for cap in kept:
        assert any(ln.startswith(f"# {cap}: ") for ln in comments), f"{cap} kept without a reason"

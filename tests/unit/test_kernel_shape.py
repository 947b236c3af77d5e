"""A healthy kernel log pasted alone is a kernel log by its shape (issue 35: "a paste ... is a kernel log when its
lines are the kernel's"): "ok", not UNRECOGNIZED_INPUT, in every prefix form dmesg, journalctl and syslog print;
the daemon's kernel follower finds the same (nothing); prose and config files are still unrecognised.
Excerpts: tests/fixtures/kernel_log/healthy (SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.environment import Environment
from dgxdoctor.result import Status
from dgxdoctor.sources.kernel_lines import kernel_line

REPO = Path(__file__).resolve().parents[2]
HEALTHY = REPO / "tests" / "fixtures" / "kernel_log" / "healthy"
EXCERPTS = sorted(HEALTHY.glob("*.txt"))
# This machine's own kernel records (kernel 6.18.44, util-linux 2.38), the same 29 records in each form dmesg prints.
FORMS = ("dmesg_bridge_veth", "dmesg_T_bridge_veth", "dmesg_iso_bridge_veth", "dmesg_r_bridge_veth")


def test_every_prefix_form_is_held() -> None:
    assert {p.stem for p in EXCERPTS} >= {*FORMS, "dmesg_x_bridge_veth"}
    assert {"fedora_coreos_558_journalctl_k", "nouveau_22_syslog_dmesg_stamp", "nvidia_docker_1058_dmesg_boot"} <= {
        p.stem for p in EXCERPTS
    }


@pytest.mark.parametrize("path", EXCERPTS, ids=lambda p: p.stem)
def test_a_healthy_kernel_log_alone_is_a_kernel_log_and_ok(path: Path) -> None:
    (found,) = diagnose(path.read_text())
    assert found.kind == "kernel-log"
    assert found.status is Status.OK
    assert [f.code for f in found.findings] == ["NO_XID_EVENTS"]
    done = run_cli("diagnose", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "UNRECOGNIZED" not in done.stdout


@pytest.mark.parametrize("path", EXCERPTS, ids=lambda p: p.stem)
def test_one_pasted_healthy_line_is_a_kernel_log(path: Path) -> None:
    """The first line of each form with a subsystem prefix, pasted alone."""
    line = next(line for line in path.read_text().splitlines() if kernel_line(line))
    (found,) = diagnose(line + "\n")
    assert (found.kind, found.status) == ("kernel-log", Status.OK), line


@pytest.mark.parametrize("path", EXCERPTS, ids=lambda p: p.stem)
def test_the_daemon_and_diagnose_find_the_same_nothing(tmp_path: Path, path: Path) -> None:
    """The daemon's path (the xid check following the log) and diagnose's: no finding above OK, the same codes."""
    text = path.read_text()
    log = tmp_path / "kern.log"
    log.write_text(text)
    env = Environment(kmsg_path=log, sysfs_root=tmp_path / "no-sys", state_dir=tmp_path / "state")
    check = XidCheck(XidSettings(), env)
    try:
        followed = [f for f in check.run().findings if f.code.startswith(("KERNEL_", "XID_", "SXID_"))]
    finally:
        check.stop()
    pasted = [f for f in KernelLogAnalyzer().analyze(text).findings if f.code.startswith(("KERNEL_", "XID_", "SXID_"))]
    assert followed == pasted == []


# Bare kernel lines (no prefix) that the kernel parsers know, pasted alone: healthy, and read as the kernel's.
BARE = [
    "mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link ACTIVE",
    "mlx5_core 0000:01:00.0 enp1s0f0: Link up",
    "nfs: server 10.0.0.1 OK",
]


@pytest.mark.parametrize("line", BARE)
def test_a_bare_healthy_kernel_line_is_a_kernel_log(line: str) -> None:
    (found,) = diagnose(line + "\n")
    assert (found.kind, found.status) == ("kernel-log", Status.OK)


NOT_KERNEL = {
    "prose": (
        "The agent runs on every node and reports ok, warning, critical or unknown.\n"
        "It reads the kernel log, vLLM's metrics and Ray's dashboard: see docs/checks.\n"
    ),
    "config": (REPO / "pyproject.toml").read_text(),
    "readme": (REPO / "README.md").read_text(),
    "python": (REPO / "src" / "dgxdoctor" / "sources" / "kernel_lines.py").read_text(),
    "stamped prose": "[   12.500000] the cache warmed up in twelve seconds\n[   13.000000] and then it idled\n",
    "another daemon's syslog": (
        "Feb 14 05:03:41 gpu-1 sshd[812]: Accepted publickey for root from 10.0.0.2 port 52144 ssh2\n"
        "Feb 14 05:03:42 gpu-1 systemd[1]: Started Session 4 of User root.\n"
    ),
    "journal of vllm": "2026-12-05T15:08:12.000000+0000 gpu-1 vllm[15597]: INFO:     Application startup complete.\n",
}


@pytest.mark.parametrize("name", sorted(NOT_KERNEL))
def test_text_that_is_not_the_kernels_is_still_unrecognised(name: str) -> None:
    text = NOT_KERNEL[name]
    assert not KernelLogAnalyzer().detect(text)
    assert all(d.kind != "kernel-log" for d in diagnose(text))
    if name != "journal of vllm":  # an INFO line of vLLM's is a healthy vLLM log, not unrecognised
        assert [f.code for d in diagnose(text) for f in d.findings] == ["UNRECOGNIZED_INPUT"]


def test_a_kernel_log_with_faults_is_still_read_for_them() -> None:
    """The shape adds a reading; the faults in a stamped log are named as before."""
    healthy = (HEALTHY / "dmesg_bridge_veth.txt").read_text()
    fault = "[22700.000000] mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link DOWN\n"
    (found,) = diagnose(healthy + fault)
    assert found.kind == "kernel-log"
    assert [(f.code, f.status) for f in found.findings] == [("KERNEL_LINK_DOWN", Status.CRITICAL)]

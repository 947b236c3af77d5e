"""Issue 35's kernel fault families, each from a real report (tests/fixtures/kernel_log/reports, SOURCES.md): one
finding per report on the device it names, the same from ``diagnose`` and from the daemon's followed log (one
parser, one joiner, one judge), and a pasted line read as a kernel log whatever prefix it carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.environment import Environment
from dgxdoctor.result import Finding, Status

KERNEL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"
REPORTS = KERNEL_LOG / "reports"

C, W = Status.CRITICAL, Status.WARNING
# Each report: its findings as (code, device, status), each counted once.
EXPECTED: dict[str, set[tuple[str, str | None, Status]]] = {
    "mlx5_bond_link_down.txt": {("KERNEL_LINK_DOWN", "mlx5_3", C), ("KERNEL_LINK_DOWN", "enp83s0f0np0", C)},
    "mlx5_no_done_completion.txt": {("KERNEL_MLX5_CMD_TIMEOUT", "0000:56:00.0", C)},
    "mlx5_health_buffer.txt": {("KERNEL_MLX5_HEALTH", "0000:08:00.0", C)},
    "aer_fatal_id_syslog.txt": {("KERNEL_AER_FATAL", "0000:00:01.0", C)},
    "aer_fatal_e1000e.txt": {("KERNEL_AER_FATAL", "0002:01:00.0", C)},
    "aer_recovery_failed.txt": {("KERNEL_AER_UNRECOVERED", "0000:00:01.1", W), ("KERNEL_AER_FATAL", "0000:00:01.0", C)},
    "edac_sbridge_mce_corrected.txt": {("KERNEL_MCE", "MC3", W)},
    "ghes_memory_corrected_iso.txt": {("KERNEL_EDAC_CE", "memory", W)},
    "ghes_memory_recoverable.txt": {("KERNEL_EDAC_UE", "memory", C)},
    # the kernel's own "mce: Uncorrected hardware memory error in user-access" (pr_err, mce/core.c): a templated message
    "memory_failure_sigbus.txt": {
        ("KERNEL_MEMORY_FAILURE", "memory", C),
        ("KERNEL_MCE", None, W),
        ("KERNEL_MCE_MESSAGE", None, W),
    },
    "rcu_stall.txt": {("KERNEL_RCU_STALL", None, W)},
    "workqueue_lockup.txt": {("KERNEL_WORKQUEUE_LOCKUP", None, W)},
    "oom_report_syslog.txt": {("KERNEL_OOM_KILL", None, W)},
    "nvrm_gsp_wpr2.txt": {("KERNEL_NVRM_INIT_FAILED", "0000:04:00.0", C)},
    "nvrm_probe_failed.txt": {("KERNEL_NVRM_INIT_FAILED", "0000:01:00.0", C)},
    "nvrm_probe_with_driver_6x.txt": {("KERNEL_NVRM_INIT_FAILED", "0000:67:00.0", C)},
}


def _pasted(text: str) -> list[Finding]:
    return [f for f in KernelLogAnalyzer().analyze(text).findings if f.code.startswith("KERNEL_")]


def _followed(tmp_path: Path, text: str) -> list[Finding]:
    """The daemon's path: the xid check following a kernel log, on a node whose sysfs shows no devices (so it
    names them as a paste does)."""
    log = tmp_path / "kern.log"
    log.write_text(text)
    env = Environment(kmsg_path=log, sysfs_root=tmp_path / "no-sys", state_dir=tmp_path / "state")
    check = XidCheck(XidSettings(), env)
    try:
        return [f for f in check.run().findings if f.code.startswith("KERNEL_")]
    finally:
        check.stop()


def test_every_report_is_named_once_on_its_device() -> None:
    assert {p.name for p in REPORTS.glob("*.txt")} == set(EXPECTED)
    for name, expected in EXPECTED.items():
        findings = _pasted((REPORTS / name).read_text())
        assert {(f.code, f.subject, f.status) for f in findings} == expected, name
        assert all(": 1 time(s)" in f.message for f in findings if f.code != "KERNEL_LINK_DOWN"), name


def test_the_oom_report_names_its_victim_and_who_asked() -> None:
    (finding,) = _pasted((REPORTS / "oom_report_syslog.txt").read_text())
    assert "node, pid 2092" in finding.message and "invoked by systemd" in finding.message
    assert finding.evidence is not None and "Killed process 2092" in finding.evidence


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_daemon_and_diagnose_find_the_same(tmp_path: Path, name: str) -> None:
    text = (REPORTS / name).read_text()
    followed = {(f.code, f.subject, f.status, f.evidence) for f in _followed(tmp_path, text)}
    assert followed == {(f.code, f.subject, f.status, f.evidence) for f in _pasted(text)}


def test_the_daemon_and_diagnose_agree_over_every_real_line(tmp_path: Path) -> None:
    text = "".join(p.read_text() for p in sorted(REPORTS.glob("*.txt")))
    text += (KERNEL_LOG / "faults_beyond_xid.txt").read_text() + (KERNEL_LOG / "faults_lookalikes.txt").read_text()
    followed = {(f.code, f.subject, f.status, f.evidence) for f in _followed(tmp_path, text)}
    pasted = {(f.code, f.subject, f.status, f.evidence) for f in _pasted(text)}
    assert followed == pasted and len(pasted) > 20


# The issue's four lines, as its report quotes them; each as the tools print it.
ISSUE_LINES = {
    "mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link DOWN": ("KERNEL_LINK_DOWN", "mlx5_3", C),
    "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010": ("KERNEL_AER_FATAL", "0000:00:02.0", C),
    "NVRM: RmInitAdapter: Cannot initialize GSP firmware RM": ("KERNEL_NVRM_INIT_FAILED", None, C),
    "python3 invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0": (
        "KERNEL_OOM_KILL", None, W,
    ),
}  # fmt: skip
PREFIXES = {
    "bare": "",
    "dmesg": "[ 4443.97] ",
    "dmesg -T": "[Sat Dec  5 08:00:01 2026] ",
    "ISO 8601": "2026-12-05T08:00:01.123456+00:00 gpu-0 kernel: ",
    "syslog": "Dec  5 08:00:01 gpu-0 kernel: ",
    "journalctl -k": "Dec 05 08:00:01 gpu-0 kernel: ",
    "dmesg -r": "<3>[ 4443.974372] ",
    "/dev/kmsg": "3,1234,4443974372,-;",
}


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
@pytest.mark.parametrize("line", sorted(ISSUE_LINES))
def test_one_pasted_kernel_line_is_a_kernel_log(line: str, prefix: str) -> None:
    (found,) = diagnose(PREFIXES[prefix] + line + "\n")
    assert found.kind == "kernel-log"
    assert [(f.code, f.subject, f.status) for f in found.findings] == [ISSUE_LINES[line]]


def test_an_oom_head_alone_says_the_victim_is_not_in_the_log() -> None:
    (finding,) = _pasted("python3 invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0\n")
    assert "invoked by python3; the victim is not in the log" in finding.message


BENIGN = [
    "mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link ACTIVE",
    "mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged",
    "bond0: (slave enp83s0f0np0): link status definitely up, 100000 Mbps full duplex",
    "EDAC sbridge MC3: TSC 0",
    "Memory failure: 0x118cb9: recovery action for dirty LRU page: Recovered",
    "rcu: (detected by 0, t=60002 jiffies, g=-1199, q=1)",
    "pcieport 0000:00:01.1: AER: Root Port link has been reset",
    "oom_reaper: reaped process 2092 (node), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]


def test_benign_lookalikes_stay_silent_and_a_corrected_aer_is_at_most_a_warning() -> None:
    # No fault; the kernel's own "recovery action for dirty LRU page: Recovered" (pr_err) is INFO.
    assert {(f.code, f.status) for f in _pasted("\n".join(BENIGN) + "\n")} == {
        ("KERNEL_MEMORY_FAILURE_MESSAGE", Status.OK)
    }
    corrected = (
        "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:03:00.0\n"
        "r8169 0000:03:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n"
    )
    findings = _pasted(corrected)
    assert [f.subject for f in findings] == ["0000:03:00.0"]
    assert all(f.status in (Status.OK, Status.WARNING) for f in findings)

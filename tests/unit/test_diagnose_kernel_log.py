"""`dgxdoctor diagnose` on pasted kernel logs, through the real CLI."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.result import Status

KERNEL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"


def test_xid_events_in_input_order_with_catalog_fields() -> None:
    done = run_cli("diagnose", str(KERNEL_LOG / "journal_610_xid79_xid154_os_reboot.txt"), "--json")
    assert done.returncode == 2, done.stderr
    (doc,) = done.json()["inputs"]
    assert doc["kind"] == "kernel-log"
    assert doc["data"]["xid_events"] == [
        {
            "pci_bus_id": "0000:01:00",
            "xid": 79,
            "name": "GPU has fallen off the bus",
            "resolution": "RESTART_BM",
            "line": "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        },
        {
            "pci_bus_id": "0000:01:00",
            "xid": 154,
            "name": "GPU recovery action changed",
            "resolution": "XID_154_EVAL",
            "line": "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
        },
    ]
    assert doc["data"]["sxid_events"] == []
    codes = {f["code"]: f for f in doc["findings"]}
    assert codes["XID_79"]["status"] == "critical"
    assert codes["XID_79"]["evidence"].startswith("NVRM: Xid (PCI:0000:01:00): 79")
    assert codes["XID_79"]["remedy"]


def test_sxid_events_from_stdin() -> None:
    text = (KERNEL_LOG / "nvtrust_124_dmesg_sxid.txt").read_text()
    done = run_cli("diagnose", "-", "--json", stdin=text)
    (doc,) = done.json()["inputs"]
    assert [(e["pci_bus_id"], e["sxid"]) for e in doc["data"]["sxid_events"]] == [("0000:04:00.0", 22013)] * 2
    assert doc["data"]["sxid_events"][0]["line"].endswith("Non-fatal, Link 44 Minion Link DLREQ interrupt")


def test_app_level_repeats_escalate_in_a_pasted_log() -> None:
    diagnosis = KernelLogAnalyzer().analyze((KERNEL_LOG / "gpud_pr46_dmesg_ctime.txt").read_text())
    by_code = {f.code: f.status.value for f in diagnosis.findings}
    # 13 three times on one GPU; nvidia-peermem's "detected invalid context" (peer_err, a healthy teardown) is INFO
    assert by_code == {"XID_13": "critical", "XID_109": "critical", "KERNEL_PEERMEM_MESSAGE": "ok"}


def test_detection_is_conservative() -> None:
    analyzer = KernelLogAnalyzer()
    assert analyzer.detect((KERNEL_LOG / "nvsentinel_155_dmesg_fallen_off_no_xid.txt").read_text())
    # A healthy kernel line is a kernel log by its shape (issue 35), and says ok; text that is not the kernel's is
    # none (tests/unit/test_kernel_shape.py holds the forms).
    healthy = "Feb 14 05:03:41 host kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE\n"
    assert analyzer.detect(healthy)
    assert analyzer.analyze(healthy).status is Status.OK
    assert not analyzer.detect("Feb 14 05:03:41 host sshd[812]: Accepted publickey for root from 10.0.0.2\n")
    assert not analyzer.detect("[ 12.5] the cache warmed up in twelve seconds\n")


def test_lookalikes_alone_are_ok() -> None:
    diagnosis = KernelLogAnalyzer().analyze((KERNEL_LOG / "lookalikes.txt").read_text())
    assert diagnosis.data["xid_events"] == diagnosis.data["sxid_events"] == []
    assert all(e["kind"].endswith("_message") for e in diagnosis.data["kernel_events"])  # INFO at most
    assert all(f.status == Status.OK for f in diagnosis.findings)
    assert "NO_XID_EVENTS" in [f.code for f in diagnosis.findings]

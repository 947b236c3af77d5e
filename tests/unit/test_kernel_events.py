"""Kernel log faults beyond XIDs: every kind parsed to the device it names, judged, counted by the xid check, named
by `diagnose`; the look-alikes stay silent. Lines: tests/fixtures/kernel_log/faults_beyond_xid.txt (SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.environment import Environment
from dgxdoctor.judge.kernel_families import assess_message
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.kernel_events import parse_kernel_event
from pcitree import build_pci_tree

KERNEL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"
FAULTS = KERNEL_LOG / "faults_beyond_xid.txt"
LOOKALIKES = KERNEL_LOG / "faults_lookalikes.txt"

# (kind, device label) of each line of FAULTS on the DGX H100 PCI tree (tests/fixtures/pci/dgx_h100.txt).
EXPECTED = {
    ("link_down", "mlx5_0"),
    ("module_event", "mlx5_1"),
    ("module_event", "mlx5_2"),
    ("mlx5_cmd_timeout", "mlx5_3"),
    ("mlx5_health", "mlx5_4"),
    ("mlx5_fatal", "mlx5_5"),
    ("aer_corrected", "0000:18:00.0"),
    ("aer_fatal", "0000:05:00.0"),
    ("aer_nonfatal", "mlx5_6"),
    ("mce", ""),
    ("edac_ce", "MC0"),
    ("edac_ue", "MC0"),
    ("hung_task", ""),
    ("soft_lockup", "cpu7"),
    ("oom_kill", ""),
    ("nfs_not_responding", "nfs:100.73.159.36"),
    ("nvrm_init_failed", "0000:3a:00.0"),
    ("nvrm_api_mismatch", ""),
    ("nvswitch_fatal", "0000:06:00.0"),
    ("peermem_load_failed", ""),
}


def _check(tmp_path: Path, text: str) -> CheckResult:
    log = tmp_path / "kern.log"
    log.write_text(text)
    sysfs = build_pci_tree(tmp_path / "sys", "dgx_h100.txt")
    check = XidCheck(XidSettings(), Environment(kmsg_path=log, sysfs_root=sysfs, state_dir=tmp_path / "state"))
    try:
        return check.run()
    finally:
        check.stop()


def _counted(result: CheckResult) -> dict[tuple[str, str], float]:
    return {
        (s.labels["kind"], s.labels["device"]): s.value
        for s in result.samples
        if s.metric.name == "dgxdoctor_kernel_events_total"
    }


def test_every_kind_is_counted_against_the_device_it_names(tmp_path: Path) -> None:
    result = _check(tmp_path, FAULTS.read_text())
    assert set(_counted(result)) == EXPECTED
    findings = {(f.code, f.subject): f for f in result.findings}
    oom = findings[("KERNEL_OOM_KILL", None)]
    assert oom.status == Status.CRITICAL and "ray::RayWorkerW, pid 48213" in oom.message
    gpu_aer = findings[("KERNEL_AER_CORRECTED", "0000:18:00.0")]
    assert gpu_aer.status == Status.WARNING and "GPU 0 (0000:18:00.0)" in gpu_aer.message
    assert findings[("KERNEL_AER_FATAL", "0000:05:00.0")].message.startswith("fatal PCIe error on NVSwitch 0")
    assert findings[("KERNEL_LINK_DOWN", "mlx5_0")].status == Status.CRITICAL
    assert "HCA mlx5_3" in findings[("KERNEL_MLX5_CMD_TIMEOUT", "mlx5_3")].message
    assert findings[("KERNEL_NVRM_INIT_FAILED", "0000:3a:00.0")].message.startswith("GPU failed to initialise on GPU 2")
    assert findings[("KERNEL_PEERMEM_LOAD_FAILED", None)].status == Status.WARNING
    assert result.status == Status.CRITICAL
    assert "kernel: " in result.summary


def test_lookalikes_count_nothing(tmp_path: Path) -> None:
    # No fault; a message of the kernel's own table the look-alike prints is at most INFO (judge/kernel_families.py).
    for line in LOOKALIKES.read_text().splitlines() + (KERNEL_LOG / "lookalikes.txt").read_text().splitlines():
        event = parse_kernel_event(line)
        assert event is None or event.kind in ("link_up", "nfs_ok", "kernel_message"), line
        if event is not None and event.kind == "kernel_message":
            assert assess_message(event.family, event.level).status == Status.OK, line
    result = _check(tmp_path, LOOKALIKES.read_text())
    assert all(kind.endswith("_message") for kind, _ in _counted(result))
    assert result.status == Status.OK
    assert all(f.status == Status.OK for f in result.findings if f.code.startswith("KERNEL_"))


def test_a_link_that_came_back_is_a_flap_and_nfs_ok_clears_the_outage(tmp_path: Path) -> None:
    text = (
        "mlx5_core 0000:1a:00.0 ibp26s0: Link down\n"
        "mlx5_core 0000:1a:00.0 ibp26s0: Link up\n"
        "nfs: server 10.0.0.5 not responding, still trying\n"
        "nfs: server 10.0.0.5 OK\n"
    )
    result = _check(tmp_path, text)
    codes = {f.code: f.status for f in result.findings}
    assert codes["KERNEL_LINK_FLAPPED"] == Status.WARNING
    assert codes["KERNEL_NFS_NOT_RESPONDING"] == Status.WARNING
    assert _counted(result) == {("link_down", "mlx5_0"): 1.0, ("nfs_not_responding", "nfs:10.0.0.5"): 1.0}


@pytest.mark.parametrize(
    ("comm", "status"),
    [("ray::RayWorkerW", Status.CRITICAL), ("VLLM::EngineCor", Status.CRITICAL), ("java", Status.WARNING)],
)
def test_the_oom_killer_is_critical_for_serving_processes(tmp_path: Path, comm: str, status: Status) -> None:
    line = f"Out of memory: Killed process 4242 ({comm}) total-vm:1000kB, anon-rss:900kB, file-rss:0kB\n"
    (finding,) = [f for f in _check(tmp_path, line).findings if f.code == "KERNEL_OOM_KILL"]
    assert finding.status == status


@pytest.mark.parametrize(("uid", "status"), [(0, Status.CRITICAL), (65534, Status.WARNING)])
def test_an_oom_killed_look_alike_of_another_user_is_no_serving_process(
    tmp_path: Path, uid: int, status: Status
) -> None:
    """The comm is anyone's to choose (a copy of any program named ``vllm``); the ``UID:`` the kernel writes is not."""
    line = (f"Out of memory: Killed process 4242 (vllm) total-vm:1000kB, anon-rss:900kB, file-rss:0kB, "
            f"shmem-rss:0kB, UID:{uid} pgtables:16kB oom_score_adj:0\n")  # fmt: skip
    (finding,) = [f for f in _check(tmp_path, line).findings if f.code == "KERNEL_OOM_KILL"]
    assert finding.status == status
    assert ("of uid 65534, not a serving user" in finding.message) is (uid == 65534)


def test_diagnose_names_the_same_lines_and_detects_the_kind() -> None:
    text = FAULTS.read_text()
    assert KernelLogAnalyzer().detect(text)
    # The look-alikes are a kernel log by their shape (issue 35), and a healthy one: ok, no finding above it.
    assert KernelLogAnalyzer().detect(LOOKALIKES.read_text())
    assert KernelLogAnalyzer().analyze(LOOKALIKES.read_text()).status is Status.OK
    done = run_cli("diagnose", str(FAULTS), "--json")
    (doc,) = [d for d in done.json()["inputs"] if d["kind"] == "kernel-log"]
    kinds = {(e["kind"], e["device"]) for e in doc["data"]["kernel_events"]}
    # A paste has no sysfs of its node: devices are named as the lines name them.
    assert {k for k, _ in kinds} == {k for k, _ in EXPECTED}
    assert ("link_down", "ibp26s0") in kinds and ("aer_fatal", "0000:05:00.0") in kinds
    codes = {f["code"] for f in doc["findings"]}
    assert {"KERNEL_OOM_KILL", "KERNEL_MLX5_HEALTH", "KERNEL_NFS_NOT_RESPONDING", "KERNEL_EDAC_UE"} <= codes
    assert done.returncode == 2


def test_diagnose_stays_silent_on_the_lookalikes() -> None:
    done = run_cli("diagnose", "--kind", "kernel-log", str(LOOKALIKES), "--json")
    (doc,) = done.json()["inputs"]
    assert [f["code"] for f in doc["findings"]] == ["NO_XID_EVENTS"]
    assert doc["data"]["kernel_events"] == []


def test_kernel_faults_survive_a_restart_of_the_daemon(tmp_path: Path) -> None:
    """The tallies ride in the xid check's memory (xid.json): a restart resumes after the last record read, and the
    OOM kill before it is still reported, not lost and not counted twice."""
    from test_xid_memory import daemon_check, ring

    oom = "Out of memory: Killed process 48213 (ray::RayWorkerW) total-vm:98765432kB, anon-rss:45678901kB"
    records = ring({3: oom, 5: "nfs: server 10.0.0.5 not responding, still trying"}, 0, 9)
    first = daemon_check(tmp_path, records)
    first.ingest(first.reader.read_available())
    assert _counted(first.run())[("oom_kill", "")] == 1.0
    first.stop()
    second = daemon_check(tmp_path, records)  # same boot, same ring: resumes after record 9
    second._open()
    second.ingest(second.reader.read_available())
    result = second.run()
    assert _counted(result) == {("oom_kill", ""): 1.0, ("nfs_not_responding", "nfs:10.0.0.5"): 1.0}
    assert next(f for f in result.findings if f.code == "KERNEL_OOM_KILL").status == Status.CRITICAL

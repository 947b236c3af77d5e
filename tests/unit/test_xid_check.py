"""The xid check over kernel logs laid out as files (the kmsg path is a seam) and injected records."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.kmsg import KmsgRecord
from dgxdoctor.validation import validate

KERNEL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception"


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0, uptime: float = 10_000.0) -> None:
        self.now = now
        self.uptime = uptime

    def wall(self) -> float:
        return self.now

    def mono(self) -> float:
        return self.uptime

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.uptime += seconds


def _check(path: Path, clock: FakeClock | None = None, **settings: object) -> XidCheck:
    clock = clock or FakeClock()
    env = Environment(node="n1", kmsg_path=path, clock=clock.wall, monotonic=clock.mono)
    return XidCheck(validate(XidSettings, settings), env)  # type: ignore[arg-type]


def _log(tmp_path: Path, *fixtures: str) -> Path:
    path = tmp_path / "kern.log"
    path.write_text("".join((KERNEL_LOG / f).read_text() for f in fixtures))
    return path


def _sample(result: CheckResult, name: str, **labels: str) -> float | None:
    for s in result.samples:
        if s.metric.name == name and dict(s.labels) == labels:
            return s.value
    return None


def test_no_kernel_log_is_skipped(tmp_path: Path) -> None:
    result = _check(tmp_path / "missing").run()
    assert result.status == Status.SKIPPED and "no kernel log" in result.summary


def test_clean_log_is_ok_and_exports_kmsg_counters(tmp_path: Path) -> None:
    result = _check(_log(tmp_path, "lookalikes.txt")).run()
    assert result.status == Status.OK
    # nvidia-peermem's "detected invalid context" (peer_err, a healthy teardown) is an INFO message, no more
    assert [(f.code, f.status) for f in result.findings] == [("KERNEL_PEERMEM_MESSAGE", Status.OK)]
    assert _sample(result, "dgxdoctor_kmsg_records_lost_total") == 0
    assert _sample(result, "dgxdoctor_kmsg_following") == 0


def test_fallen_off_bus_is_critical_reboot_with_counter_and_last_seen(tmp_path: Path) -> None:
    result = _check(_log(tmp_path, "open_gpu_1151_journal_xid79.txt")).run()
    assert result.status == Status.CRITICAL
    (finding,) = result.findings
    assert (finding.code, finding.subject) == ("XID_79", "0000:2b:00")
    assert finding.evidence and "Xid (PCI:0000:2b:00): 79" in finding.evidence
    assert result.action is not None and result.action.kind == "reboot_node"
    assert _sample(result, "dgxdoctor_xid_errors_total", pci_bus_id="0000:2b:00", xid="79") == 1
    assert _sample(result, "dgxdoctor_xid_last_seen_timestamp_seconds", pci_bus_id="0000:2b:00", xid="79") == 1.8e9
    # The catalog entry, for grouping XIDs by what they need (the overview dashboard joins on xid).
    (info,) = [s for s in result.samples if s.metric.name == "dgxdoctor_xid_catalog_info"]
    assert dict(info.labels) == {"xid": "79", "name": "GPU has fallen off the bus", "resolution": "RESTART_BM"}
    assert info.value == 1


def test_counters_are_monotonic_and_new_lines_are_folded_in(tmp_path: Path) -> None:
    path = _log(tmp_path, "gpud_pr46_dmesg_ctime.txt")
    check = _check(path)
    first = check.run()
    assert _sample(first, "dgxdoctor_xid_errors_total", pci_bus_id="0000:cb:00", xid="13") == 3
    with path.open("a") as fh:
        fh.write(XID_13 + "\n")
    second = check.run()
    assert _sample(second, "dgxdoctor_xid_errors_total", pci_bus_id="0000:cb:00", xid="13") == 4
    assert _sample(second, "dgxdoctor_xid_errors_total", pci_bus_id="0000:cb:00", xid="109") == 1


def test_app_level_xid_is_a_warning_to_restart_the_app(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(XID_13 + "\n")
    result = _check(path).run()
    assert result.status == Status.WARNING
    assert result.action is not None and result.action.kind == "restart_app"


def test_repeats_within_the_window_escalate(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(XID_13 + "\n")
    clock = FakeClock()
    check = _check(path, clock, repeat_threshold=3, repeat_window_s=600)
    assert check.run().status == Status.WARNING
    for _ in range(2):
        clock.advance(60)
        with path.open("a") as fh:
            fh.write(XID_13 + "\n")
    escalated = check.run()
    assert escalated.status == Status.CRITICAL
    assert "repeated 3 times" in (escalated.findings[0].remedy or "")
    clock.advance(3600)  # the window has passed: back to a warning
    assert check.run().status == Status.WARNING


def test_repeats_on_different_gpus_do_not_escalate(tmp_path: Path) -> None:
    path = _log(tmp_path, "open_gpu_1150_journal_xid45.txt")  # 5 x XID 45 over 4 GPUs
    result = _check(path).run()
    assert result.status == Status.WARNING
    assert {f.subject for f in result.findings} == {"0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"}


def test_override_sets_the_status(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(XID_13 + "\n" + XID_79 + "\n")
    result = _check(path, overrides={"13": "critical", "79": "ok"}).run()
    by_code = {f.code: f.status for f in result.findings}
    assert by_code == {"XID_13": Status.CRITICAL, "XID_79": Status.OK}


def test_ignore_class_xid_is_ok_but_counted(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text((KERNEL_LOG / "docs_pages_single_lines.txt").read_text().splitlines()[0] + "\n")
    result = _check(path).run()
    assert result.status == Status.OK
    assert _sample(result, "dgxdoctor_xid_errors_total", pci_bus_id="0000:10:1c", xid="63") == 1


def test_nvlink5_nonfatal_is_a_warning_and_fatal_needs_a_reset(tmp_path: Path) -> None:
    result = _check(_log(tmp_path, "gpud_pr1160_pr1174_nvlink5.txt")).run()
    by_subject = {(f.subject, f.code): f.status for f in result.findings}
    assert by_subject[("0000:01:00", "XID_144")] == Status.WARNING
    assert by_subject[("0018:01:00", "XID_145")] == Status.WARNING
    assert by_subject[("0000:00:00", "XID_149")] == Status.CRITICAL
    assert result.action is not None and result.action.kind == "reset_gpu"


def test_xid154_takes_the_action_from_the_message(tmp_path: Path) -> None:
    result = _check(_log(tmp_path, "dmesg_ctime_xid79_xid154_node_reboot.txt")).run()
    finding = next(f for f in result.findings if f.code == "XID_154")
    assert finding.status == Status.CRITICAL and "reboot" in (finding.remedy or "")


def test_sxid_counter_and_severity_from_the_line(tmp_path: Path) -> None:
    result = _check(_log(tmp_path, "nvtrust_124_dmesg_sxid.txt")).run()
    assert _sample(result, "dgxdoctor_nvswitch_sxid_errors_total", pci_bus_id="0000:04:00.0", sxid="22013") == 2
    assert result.status == Status.OK  # 22013 MINION_NONFATAL: IGNORE in the catalog


def test_clear_after_keeps_counting_but_stops_alarming(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(XID_79 + "\n")
    clock = FakeClock()
    check = _check(path, clock, clear_after_s=3600)
    assert check.run().status == Status.CRITICAL
    clock.advance(7200)
    result = check.run()
    assert result.status == Status.OK
    assert _sample(result, "dgxdoctor_xid_errors_total", pci_bus_id="0000:3b:00", xid="79") == 1


def test_kmsg_records_use_the_kernel_timestamp_and_lookback(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    clock = FakeClock(now=1_800_000_000.0, uptime=10_000.0)
    check = _check(path, clock, lookback_s=600)
    check.run()  # opens the log: the look-back starts at uptime 9400 s
    old = KmsgRecord(message=XID_79.replace("3b", "3c"), seq=1, usec=9_000_000_000)
    new = KmsgRecord(message=XID_79, seq=2, usec=9_990_000_000)
    check.ingest([old, new])
    result = check.run()
    assert check.count("0000:3c:00", 79) == 0
    assert _sample(result, "dgxdoctor_xid_last_seen_timestamp_seconds", pci_bus_id="0000:3b:00", xid="79") == (
        pytest.approx(1_800_000_000.0 - 10.0)
    )


def test_xid79_and_fallen_off_merge_only_when_close_in_time(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    check = _check(path)
    check.run()
    fallen = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    check.ingest([KmsgRecord(XID_79, seq=1, usec=100_000_000), KmsgRecord(fallen, seq=2, usec=100_000_100)])
    assert check.count("0000:3b:00", 79) == 1
    check.ingest([KmsgRecord(fallen, seq=3, usec=900_000_000)])  # minutes later: a new event
    assert check.count("0000:3b:00", 79) == 2


def test_follower_folds_new_lines_in(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("")
    check = _check(path)
    check.start_following()
    try:
        assert check.following
        with path.open("a") as fh:
            fh.write(XID_79 + "\n")
        deadline = time.monotonic() + 10
        while check.count("0000:3b:00", 79) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        result = check.run()
        assert result.status == Status.CRITICAL
        assert _sample(result, "dgxdoctor_kmsg_following") == 1
    finally:
        check.stop()
    assert not check.following


def test_start_following_a_missing_log_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        _check(tmp_path / "missing").start_following()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_log_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(XID_79 + "\n")
    path.chmod(0)
    try:
        with pytest.raises(RuntimeError, match="cannot read"):
            _check(path).run()
    finally:
        path.chmod(0o644)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"thirteen": "critical"}, "overrides: keys must be XID numbers"),
        ({"13": "fatal"}, "Invalid enum value 'fatal'"),
    ],
)
def test_bad_overrides_name_the_key(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message):
        validate(XidSettings, {"overrides": overrides})
    with pytest.raises(ConfigError) as err:
        parse_config({"checks": {"xid": {"overrides": overrides}}})
    assert message in str(err.value) and "- at `$.checks.xid" in str(err.value)


async def test_start_follows_the_log_in_the_daemon_only(tmp_path: Path) -> None:
    import asyncio

    from msgspec.structs import replace

    path = tmp_path / "kern.log"
    path.write_text(XID_79 + "\n")
    one_shot = _check(path)
    one_shot.start()
    assert not one_shot.following
    check = _check(path)
    check.env = replace(check.env, one_shot=False)
    check.start()
    assert check.following
    try:
        deadline = time.monotonic() + 10
        while check.count("0000:3b:00", 79) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert check.count("0000:3b:00", 79) == 1
    finally:
        check.stop()


def test_driver_boot_records_are_not_events(tmp_path: Path) -> None:
    from dgxdoctor.sources.kmsg import parse_kmsg_record

    path = tmp_path / "kmsg"
    path.write_text("")
    check = _check(path)
    check.run()
    raw = (KERNEL_LOG / "kmsg_records_h200_580.txt").read_text().splitlines(keepends=True)
    check.ingest([parse_kmsg_record(line) for line in raw])
    assert check.run().findings == ()

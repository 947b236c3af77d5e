"""XID counts survive a restart of the daemon within a boot; the window and the records lost are said truthfully.

Before: after a burst pushed early records out of the ring buffer and a SIGKILL + restart, the xid check reported
fewer events, the lost-records counter said 0, the summary still said "since boot", and CRITICAL "fallen off the
bus" XIDs on four GPUs had vanished. The kernel log is a fake character device here (the read seam of KmsgReader)
holding what the real ring buffer would: records numbered from 0 at boot, the oldest ones gone after a flood.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.kmsg import KmsgReader

BUSES = ("0000:3b:00", "0000:3c:00", "0000:3d:00", "0000:3e:00")
BOOT = "6f1c0c3e-1111-4d2e-9a51-0123456789ab"


def xid79(bus: str) -> str:
    return f"NVRM: Xid (PCI:{bus}): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."


def ring(messages: dict[int, str], first: int, last: int) -> dict[int, str]:
    """The ring buffer holding records ``first..last``: the given messages, filler elsewhere."""
    return {seq: messages.get(seq, f"eth0: link is up (filler {seq})") for seq in range(first, last + 1)}


def device(records: dict[int, str]) -> Callable[[int, int], bytes]:
    pending = iter(sorted(records.items()))

    def read(fd: int, size: int) -> bytes:
        item = next(pending, None)
        if item is None:
            raise BlockingIOError(errno.EAGAIN, "no more")
        seq, message = item
        return f"3,{seq},{1_000_000 + seq * 1000},-;{message}\n".encode()

    return read


def daemon_check(tmp_path: Path, records: dict[int, str], state: str = "state", boot: str = BOOT) -> XidCheck:
    proc = tmp_path / f"proc-{boot}"
    (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (proc / "sys/kernel/random/boot_id").write_text(boot + "\n")
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    env = Environment(node="n", kmsg_path=kmsg, proc_root=proc, state_dir=tmp_path / state, one_shot=False)
    check = XidCheck(XidSettings(nvml_events=False), env)
    check.reader = KmsgReader(kmsg, read=device(records), device=True)
    return check


def sample(result: CheckResult, name: str, **labels: str) -> float | None:
    found = [s.value for s in result.samples if s.metric.name == name and dict(s.labels) == labels]
    return found[0] if found else None


def xid79_counts(result: CheckResult) -> dict[str, float | None]:
    return {bus: sample(result, "dgxdoctor_xid_errors_total", pci_bus_id=bus, xid="79") for bus in BUSES}


FIRST_BURST = {1 + i: xid79(bus) for i, bus in enumerate(BUSES)}


def test_xids_survive_a_restart_after_the_buffer_lost_them(tmp_path: Path) -> None:
    first = daemon_check(tmp_path, ring(FIRST_BURST, 0, 2_000))
    before = first.run()
    assert before.status is Status.CRITICAL and "since boot" in before.summary
    assert xid79_counts(before) == dict.fromkeys(BUSES, 1.0)
    # SIGKILL: no stop(). A flood pushed records 0..999 (the four XIDs among them) out of the ring buffer, and a
    # new XID 79 arrived on one GPU meanwhile.
    after_restart = daemon_check(tmp_path, ring({2_500: xid79(BUSES[0])}, 1_000, 3_000))
    after = after_restart.run()
    assert after.status is Status.CRITICAL, after.summary
    assert sorted(f.subject for f in after.findings if f.code == "XID_79") == sorted(BUSES)
    assert xid79_counts(after) == {BUSES[0]: 2.0, **dict.fromkeys(BUSES[1:], 1.0)}  # nothing counted twice
    assert sample(after, "dgxdoctor_kmsg_records_lost_total") == 0  # all of 2001.. was still there
    assert "since boot" in after.summary


def test_records_lost_while_down_are_counted_and_said(tmp_path: Path) -> None:
    daemon_check(tmp_path, ring(FIRST_BURST, 0, 2_000)).run()
    # Down long enough for the buffer to overrun: records 2001..4999 were never read.
    result = daemon_check(tmp_path, ring({}, 5_000, 5_010)).run()
    assert sample(result, "dgxdoctor_kmsg_records_lost_total") == 2_999
    assert "2999 kernel log record(s) of this boot lost" in result.summary
    assert xid79_counts(result) == dict.fromkeys(BUSES, 1.0)


def test_since_boot_only_when_the_buffer_still_holds_the_boot(tmp_path: Path) -> None:
    result = daemon_check(tmp_path, ring({1_500: xid79(BUSES[0])}, 1_000, 2_000)).run()
    assert "since boot" not in result.summary and "no longer held the boot" in result.summary
    assert sample(result, "dgxdoctor_kmsg_records_lost_total") == 1_000
    assert "1000 kernel log record(s) of this boot lost" in result.summary


def test_a_memory_of_another_boot_is_dropped(tmp_path: Path) -> None:
    daemon_check(tmp_path, ring(FIRST_BURST, 0, 100)).run()
    result = daemon_check(tmp_path, ring({}, 0, 50), boot="another-boot").run()
    assert xid79_counts(result) == dict.fromkeys(BUSES, None) and result.status is Status.OK
    assert "since boot" in result.summary


def test_a_damaged_memory_costs_history_not_the_check(tmp_path: Path) -> None:
    check = daemon_check(tmp_path, ring(FIRST_BURST, 0, 100))
    check.run()
    path = tmp_path / "state" / "xid.json"
    doc = json.loads(path.read_text())
    doc["xids"][0]["count"] = "many"
    doc["xids"][1]["event"] = {"nonsense": True}
    path.write_text(json.dumps(doc))
    result = daemon_check(tmp_path, ring({}, 101, 110)).run()
    counts: Iterable[float | None] = xid79_counts(result).values()
    assert sorted(c for c in counts if c is not None) == [1.0, 1.0]
    assert result.status is Status.CRITICAL


def test_a_read_only_state_dir_is_counted_not_fatal(tmp_path: Path) -> None:
    from dgxdoctor.sources.statefile import WRITE_ERRORS

    (tmp_path / "state").write_text("not a directory")  # as good as read-only: every write fails
    before = WRITE_ERRORS["xid.json"]
    result = daemon_check(tmp_path, ring(FIRST_BURST, 0, 100)).run()
    assert result.status is Status.CRITICAL
    assert WRITE_ERRORS["xid.json"] == before + 1

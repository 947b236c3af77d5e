"""XID/SXID lines from every driver era and log source (tests/fixtures/kernel_log/SOURCES.md cites each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxdoctor.judge.xid import assess_sxid, sxid_fatal
from dgxdoctor.result import Status
from dgxdoctor.sources.xid import (
    SxidEvent,
    XidEvent,
    load_catalog,
    parse_fallen_off_line,
    parse_sxid_line,
    parse_xid_line,
    scan_text,
)

KERNEL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "kernel_log"


def _keys(name: str) -> list[tuple[str, str, int]]:
    out = []
    for event in scan_text((KERNEL_LOG / name).read_text()):
        if isinstance(event, XidEvent):
            out.append(("xid", event.pci_bus_id, event.xid))
        else:
            out.append(("sxid", event.pci_bus_id, event.sxid))
    return out


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        # pre-"PCI:" era; the fallen-off line has no Xid 79 beside it, so it counts as 79
        ("pastebin_xJaypMZt_syslog_old_driver.txt", [("xid", "0000:01:00", 79), ("xid", "0000:01:00", 3)]),
        ("gpud_pr46_dmesg_ctime.txt", [("xid", "0000:cb:00", 13)] * 3 + [("xid", "0000:cb:00", 109)]),
        # Xid 79 and its "GPU ... has fallen off the bus" twin are one event
        ("open_gpu_1151_journal_xid79.txt", [("xid", "0000:2b:00", 79)]),
        ("nvsentinel_155_dmesg_fallen_off_no_xid.txt", [("xid", "0000:b3:00", 79)]),
        (
            "gpud_pr1160_pr1174_nvlink5.txt",
            [
                ("xid", "0000:01:00", 144),
                ("xid", "0000:00:00", 149),
                ("xid", "0000:00:00", 149),
                ("xid", "0019:01:00", 149),
                ("xid", "0018:01:00", 145),
                ("xid", "0000:9b:00", 94),
            ],
        ),
        (
            "open_gpu_1150_journal_xid45.txt",
            [
                ("xid", "0000:dc:00", 45),
                ("xid", "0000:ed:00", 45),
                ("xid", "0000:ba:00", 45),
                ("xid", "0000:97:00", 45),
                ("xid", "0000:dc:00", 45),
            ],
        ),
        ("nvtrust_124_dmesg_sxid.txt", [("sxid", "0000:04:00.0", 22013)] * 2),
        (
            "docs_pages_single_lines.txt",
            [
                ("xid", "0000:10:1c", 63),
                ("xid", "0000:c6:00", 79),
                ("xid", "0000:d8:00", 74),
                ("xid", "0000:65:00", 43),
            ],
        ),
        ("dmesg_ctime_xid79_xid154_node_reboot.txt", [("xid", "0000:02:00", 79), ("xid", "0000:02:00", 154)]),
        ("journal_610_xid79_xid154_os_reboot.txt", [("xid", "0000:01:00", 79), ("xid", "0000:01:00", 154)]),
        ("wrapped_lines.txt", [("xid", "0000:02:00", 79), ("xid", "0000:2a:00", 120)]),
        ("lookalikes.txt", []),
        ("lone_sxid_detail_lines.txt", [("sxid", "0000:04:00.0", 22013)]),
        ("odd_address_forms.txt", [("xid", "unknown (redacted)", 145), ("xid", "unknown (not in the paste)", 79)]),
    ],
)
def test_fixture_events_in_input_order(fixture: str, expected: list[tuple[str, str, int]]) -> None:
    assert _keys(fixture) == expected


def test_every_lookalike_line_alone_is_no_event() -> None:
    for line in (KERNEL_LOG / "lookalikes.txt").read_text().splitlines():
        assert parse_xid_line(line) is None, line
        assert parse_sxid_line(line) is None, line
        assert parse_fallen_off_line(line) is None, line


def test_pid_and_process_name() -> None:
    event = parse_xid_line(
        "NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus."
    )
    assert event is not None
    assert (event.pid, event.process, event.detail) == (1101234, "nvc:[driver]", "GPU has fallen off the bus.")
    unknown = parse_xid_line("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception")
    assert unknown is not None and (unknown.pid, unknown.process) == (None, None)


def test_bus_id_is_lowercase_without_pci_prefix() -> None:
    event = parse_xid_line("[449410.332316] NVRM: Xid (PCI:0000:D8:00): 74, pid='<unknown>', name=<unknown>, NVLink")
    assert event is not None and event.pci_bus_id == "0000:d8:00"


def test_nvlink5_subcode() -> None:
    fatal = parse_xid_line(
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000)"
    )
    assert fatal is not None and (fatal.nvlink_unit, fatal.nvlink_fatal, fatal.link) == ("NETIR_LINK_EVT", True, 0)
    nonfatal = parse_xid_line(
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001)"
    )
    assert nonfatal is not None and (nonfatal.nvlink_fatal, nonfatal.link) == (False, 13)
    no_link = parse_xid_line("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)")
    assert no_link is not None and no_link.link is None


def test_xid154_recovery_action() -> None:
    events = scan_text((KERNEL_LOG / "dmesg_ctime_xid79_xid154_node_reboot.txt").read_text())
    last = events[-1]
    assert isinstance(last, XidEvent) and last.recovery_action == "Node Reboot Required"


def test_sxid_fields() -> None:
    event = parse_sxid_line(
        "[38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt"
    )
    assert isinstance(event, SxidEvent)
    assert (event.device, event.pci_bus_id, event.sxid, event.fatal, event.link) == (
        "nvidia-nvswitch3",
        "0000:04:00.0",
        22013,
        False,
        44,
    )


def test_catalog_covers_documented_xids_with_resolutions() -> None:
    catalog = load_catalog()
    known = {
        "RESET_GPU", "RESTART_APP", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", "IGNORE", "WORKFLOW_XID_45",
        "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "CHECK_MECHANICALS", "UPDATE_SWFW",
        "CHECK_UVM", "XID_154_EVAL",
    }  # fmt: skip
    for code in range(8, 161):
        entry = catalog.xids[code]
        assert entry.name and entry.mnemonic and entry.description, code
        assert entry.resolution in known, (code, entry.resolution)
    assert catalog.xids[79].resolution == "RESTART_BM"
    assert catalog.xids[48].name == "Double Bit ECC Error"
    assert "docs.nvidia.com" in catalog.source["xid"] and catalog.source["retrieved"]
    assert catalog.xid(999).resolution == "CONTACT_SUPPORT"  # a code newer than the catalog


def test_three_line_fallen_off_message_is_one_evidence_line() -> None:
    (event,) = scan_text((KERNEL_LOG / "nvsentinel_155_dmesg_fallen_off_no_xid.txt").read_text())
    assert isinstance(event, XidEvent) and event.synthesized
    assert event.line == (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: (PCI ID: 10de:26b5) installed in this system has "
        "NVRM: fallen off the bus and is not responding to commands."
    )


@pytest.mark.parametrize(
    "line",
    [
        "SXid (PCI:0000:04:00.0): 22013, Data {0x0000002c, 0x0000002c, 0x00000000, 0x0000002c, 0x80005302}",
        "[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine "
        "instance 00",
    ],
)
def test_one_sxid_detail_line_alone_names_the_sxid_and_the_switch(line: str) -> None:
    (event,) = scan_text(line + "\n")
    assert isinstance(event, SxidEvent)
    assert (event.sxid, event.pci_bus_id, event.severity_known, event.fatal) == (22013, "0000:04:00.0", False, None)
    assert sxid_fatal(event, load_catalog().sxid(22013)) is False  # the catalog's word, decided in judge/
    assert event.device == ("nvidia-nvswitch3" if "nvswitch3" in line else "NVSwitch")


def test_a_detail_line_of_a_fatal_class_sxid_is_judged_fatal_from_the_catalog() -> None:
    (event,) = scan_text("nvidia-nvswitch0: SXid (PCI:0000:04:00.0): 12028, Severity 1 Engine instance 3\n")
    assert isinstance(event, SxidEvent) and event.fatal is None
    assert assess_sxid(event, load_catalog().sxid(12028)).status is Status.CRITICAL


def test_sxid_detail_lines_beside_their_event_add_nothing() -> None:
    events = scan_text((KERNEL_LOG / "nvtrust_124_dmesg_sxid.txt").read_text())
    assert all(isinstance(e, SxidEvent) and e.severity_known for e in events)

"""The infiniband check and the sysfs reader, over sysfs trees laid out like the kernel's (fixtures/sysfs_ib)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from dgxdoctor.checks.infiniband import InfinibandCheck, InfinibandSettings
from dgxdoctor.config import parse_config
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult
from dgxdoctor.sources.sysfs_ib import (
    SysfsFormatError,
    data_bytes,
    netdev_map,
    parse_counter,
    parse_phys_state,
    parse_rate,
    parse_state,
    read_ports,
)
from dgxdoctor.validation import validate
from sysfstree import build_sysfs_tree

IB_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ib"
BOOT_A = "0b2cf1d4-6f0e-4a47-9d1c-3f6f8c1a2b01"
BOOT_B = "7e5d9a10-2c44-4b8e-8a55-d2c1e0f9a3b7"


# -- helpers ---------------------------------------------------------------------------------------------------


def set_counter(root: Path, device: str, counter: str, value: int, port: int = 1) -> None:
    port_dir = root / "class/infiniband" / device / "ports" / str(port)
    target = port_dir / "counters" / counter
    if not target.exists():
        target = port_dir / "hw_counters" / counter
    target.write_text(f"{value}\n")


def bump(root: Path, device: str, counter: str, by: int, port: int = 1) -> None:
    port_dir = root / "class/infiniband" / device / "ports" / str(port)
    target = port_dir / "counters" / counter
    if not target.exists():
        target = port_dir / "hw_counters" / counter
    target.write_text(f"{int(target.read_text()) + by}\n")


class Clock:
    def __init__(self, t: float = 1_764_460_800.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class NoCommands:
    def __call__(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        raise CommandNotFound(f"{argv[0]} not found in PATH")


class FakeIbstat:
    def __init__(self, stdout: str, returncode: int = 0) -> None:
        self.stdout = stdout
        self.returncode = returncode
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        self.calls.append(list(argv))
        return CommandResult(tuple(argv), self.returncode, self.stdout, "")


def make_env(tmp_path: Path, fixture: str | None, clock: Clock, runner: Any = None, boot: str = BOOT_A) -> Environment:
    sysfs = tmp_path / "sys"
    sysfs.mkdir(exist_ok=True)
    if fixture is not None:
        build_sysfs_tree(sysfs, fixture)
    set_boot(tmp_path, boot)
    return Environment(
        node="dgx-a",
        sysfs_root=sysfs,
        proc_root=tmp_path / "proc",
        state_dir=tmp_path / "state",
        run_command=runner or NoCommands(),
        clock=clock,
    )


def set_boot(tmp_path: Path, boot: str) -> None:
    path = tmp_path / "proc/sys/kernel/random/boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot + "\n")


def check(env: Environment, **settings: Any) -> InfinibandCheck:
    return InfinibandCheck(validate(InfinibandSettings, settings), env)


def codes(result: CheckResult) -> dict[str, list[str | None]]:
    out: dict[str, list[str | None]] = {}
    for f in result.findings:
        out.setdefault(f.code, []).append(f.subject)
    return out


def samples(result: CheckResult, metric: str, **labels: str) -> dict[tuple[str, ...], float]:
    out = {}
    for s in result.samples:
        if s.metric.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
            out[tuple(s.labels[k] for k in s.metric.labels)] = s.value
    return out


def one(result: CheckResult, metric: str, **labels: str) -> float | None:
    found = samples(result, metric, **labels)
    assert len(found) <= 1, found
    return next(iter(found.values()), None)


# -- pure parsers ----------------------------------------------------------------------------------------------


def test_parse_sysfs_values() -> None:
    assert parse_state("4: ACTIVE\n") == "Active"
    assert parse_state("1: DOWN") == "Down"
    assert parse_state("2: INIT") == "Initializing"
    assert parse_phys_state("5: LinkUp\n") == "LinkUp"
    assert parse_phys_state("2: Polling") == "Polling"
    assert parse_phys_state("7: Phy Test") == "PhyTest"
    assert parse_rate("400 Gb/sec (4X NDR)\n") == 400.0
    assert parse_rate("200 Gb/sec (2X NDR)") == 200.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_counter("12345\n") == 12345
    assert parse_counter("N/A (no PMA)\n") is None
    assert data_bytes({"port_rcv_data": 10}, "port_rcv_data") == 40
    assert data_bytes({}, "port_rcv_data") is None


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_state, "ACTIVE"),
        (parse_phys_state, ""),
        (parse_rate, "fast"),
        (parse_counter, "-1"),
        (parse_counter, "x"),
    ],
)
def test_parse_rejects_malformed_values(parse: Any, text: str) -> None:
    with pytest.raises(SysfsFormatError):
        parse(text)


def test_read_ports_healthy_tree(tmp_path: Path) -> None:
    root = build_sysfs_tree(tmp_path, "dgx_ndr_healthy.txt")
    ports = read_ports(root)
    assert [p.name for p in ports] == [f"mlx5_{i}/1" for i in range(8)]
    p0 = ports[0]
    assert (p0.state, p0.phys_state, p0.rate_gbps, p0.link_layer) == ("Active", "LinkUp", 400.0, "InfiniBand")
    assert p0.rate_text == "400 Gb/sec (4X NDR)"
    assert p0.netdev == "ibp12s0"
    assert p0.counters["symbol_error"] == 0
    assert p0.counters["port_rcv_data"] == 1_800_000_000_000  # raw words; bytes are x4
    assert "out_of_buffer" in p0.counters and "rnr_nak_retry_err" in p0.counters
    assert "lifespan" not in p0.counters  # a setting, not a counter
    assert p0.counters_note is None


def test_read_ports_degraded_tree_keeps_unreadable_counters_absent(tmp_path: Path) -> None:
    ports = {p.device: p for p in read_ports(build_sysfs_tree(tmp_path, "dgx_ndr_degraded.txt"))}
    assert ports["mlx5_2"].rate_gbps == 200.0
    assert (ports["mlx5_5"].state, ports["mlx5_5"].phys_state) == ("Down", "Polling")
    bad = ports["mlx5_6"]
    assert "out_of_buffer" not in bad.counters  # absent, not zero
    assert bad.counters["symbol_error"] == 3412
    assert bad.counters_note == "1 unreadable in hw_counters/"


def test_read_ports_no_pma(tmp_path: Path) -> None:
    (port,) = read_ports(build_sysfs_tree(tmp_path, "no_pma.txt"))
    assert port.device == "rxe0" and port.link_layer == "Ethernet" and port.netdev == "eth0"
    assert "symbol_error" not in port.counters and "port_rcv_data" not in port.counters
    assert port.counters["sent_pkts"] == 81240
    assert port.counters_note == "N/A (no PMA)"


def test_netdev_map_uses_dev_port(tmp_path: Path) -> None:
    dev = tmp_path / "mlx5_0"
    for name, idx in (("enp1s0f0np0", 0), ("enp1s0f1np1", 1)):
        (dev / "device/net" / name).mkdir(parents=True)
        (dev / "device/net" / name / "dev_port").write_text(f"{idx}\n")
    assert netdev_map(dev) == {1: "enp1s0f0np0", 2: "enp1s0f1np1"}
    assert netdev_map(tmp_path / "absent") == {}


def test_no_class_directory_reads_nothing(tmp_path: Path) -> None:
    assert read_ports(tmp_path) == []


# -- the check: presence ---------------------------------------------------------------------------------------


def test_skipped_without_sysfs_or_ibstat(tmp_path: Path) -> None:
    result = check(make_env(tmp_path, None, Clock())).run()
    assert result.status is Status.SKIPPED
    assert "no ibstat" in result.summary


def test_skipped_when_ibstat_lists_nothing(tmp_path: Path) -> None:
    runner = FakeIbstat("")  # ibstat with no devices prints nothing and exits 0
    result = check(make_env(tmp_path, None, Clock(), runner)).run()
    assert result.status is Status.SKIPPED
    assert "ibstat lists no device" in result.summary
    assert runner.calls == [["ibstat"]]


def test_ibstat_fallback_when_sysfs_has_no_devices(tmp_path: Path) -> None:
    runner = FakeIbstat((IB_FIXTURES / "ibstat_cx6_hdr_down.txt").read_text())
    env = make_env(tmp_path, None, Clock(), runner)
    (env.sysfs_root / "class/infiniband").mkdir(parents=True)
    result = check(env, min_rate_gbps=200).run()
    assert result.status is Status.CRITICAL
    found = codes(result)
    assert found["IB_PORT_DOWN"] == ["mlx5_1/1"]
    assert found["IB_PORT_NOT_ACTIVE"] == ["mlx5_2/1"]
    assert found["IB_PORT_DISABLED"] == ["mlx5_3/1"]
    assert "from ibstat" in result.summary
    assert one(result, "dgxdoctor_ib_port_rate_gbps", device="mlx5_0") == 200.0
    assert one(result, "dgxdoctor_ib_port_up", device="mlx5_1") == 0.0
    assert samples(result, "dgxdoctor_ib_port_events_total") == {}  # ibstat shows no counters: none exported
    assert samples(result, "dgxdoctor_ib_port_rcv_bytes_total") == {}


def test_ibstat_failure_raises_for_the_runner(tmp_path: Path) -> None:
    env = make_env(tmp_path, None, Clock(), FakeIbstat("", returncode=255))
    with pytest.raises(RuntimeError, match="ibstat exited 255"):
        check(env).run()


# -- the check: state, rate, link layer, expected ports --------------------------------------------------------


def test_healthy_node_is_ok(tmp_path: Path) -> None:
    result = check(make_env(tmp_path, "dgx_ndr_healthy.txt", Clock()), expected_ports=8, min_rate_gbps=400).run()
    assert result.status is Status.OK, result.findings
    assert result.summary == "8/8 RDMA port(s) Active at 400 Gb/s"
    assert len(samples(result, "dgxdoctor_ib_port_rate_gbps")) == 8
    assert set(samples(result, "dgxdoctor_ib_port_up").values()) == {1.0}
    assert one(result, "dgxdoctor_ib_port_events_total", device="mlx5_0", counter="symbol_error") == 0.0
    # The data counters count 4-byte words; exported in bytes, in families of their own (node_exporter's units).
    words = int((tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data").read_text())
    assert one(result, "dgxdoctor_ib_port_rcv_bytes_total", device="mlx5_0") == words * 4
    assert samples(result, "dgxdoctor_ib_port_events_total", counter="port_rcv_data") == {}
    info = samples(result, "dgxdoctor_ib_port_info", device="mlx5_3")
    assert list(info) == [("mlx5_3", "1", "InfiniBand", "Active", "LinkUp", "ibp94s0")]
    # First run: a baseline, so no rates yet (absent, not zero).
    assert samples(result, "dgxdoctor_ib_port_rcv_bytes_per_second") == {}
    assert result.facts["ib_port_count"] == "8"
    assert result.facts["ib_port_rates_gbps"] == "400"


def test_degraded_node(tmp_path: Path) -> None:
    env = make_env(tmp_path, "dgx_ndr_degraded.txt", Clock())
    result = check(env, expected_ports=8, min_rate_gbps=400, link_layer="InfiniBand").run()
    assert result.status is Status.CRITICAL
    found = codes(result)
    assert found["IB_PORT_RATE_LOW"] == ["mlx5_2/1"]
    assert found["IB_PORT_DOWN"] == ["mlx5_5/1"]
    assert "IB_PORTS_MISSING" not in found
    down = next(f for f in result.findings if f.code == "IB_PORT_DOWN")
    assert down.status is Status.CRITICAL and "Polling" in down.message and "ibp192s0" in down.message
    low = next(f for f in result.findings if f.code == "IB_PORT_RATE_LOW")
    assert low.status is Status.WARNING and "200 Gb/sec (2X NDR)" in low.message
    assert one(result, "dgxdoctor_ib_port_up", device="mlx5_5") == 0.0
    assert one(result, "dgxdoctor_ib_port_rate_gbps", device="mlx5_5") is None  # no link: no rate
    assert one(result, "dgxdoctor_ib_port_rate_gbps", device="mlx5_2") == 200.0
    # The unreadable counter is absent, not zero.
    assert samples(result, "dgxdoctor_ib_port_events_total", device="mlx5_6", counter="out_of_buffer") == {}
    assert result.action is not None and result.action.kind == "investigate"


def test_missing_ports_are_critical(tmp_path: Path) -> None:
    result = check(make_env(tmp_path, "dgx_ndr_healthy.txt", Clock()), expected_ports=10).run()
    assert result.status is Status.CRITICAL
    assert codes(result)["IB_PORTS_MISSING"] == [None]


def test_include_exclude(tmp_path: Path) -> None:
    env = make_env(tmp_path, "dgx_ndr_degraded.txt", Clock())
    result = check(env, devices_exclude=["mlx5_5", "mlx5_2/1"], min_rate_gbps=400).run()
    assert "IB_PORT_DOWN" not in codes(result) and "IB_PORT_RATE_LOW" not in codes(result)
    assert result.facts["ib_port_count"] == "6"
    only = check(env, devices_include=["mlx5_[01]"]).run()
    assert only.facts["ib_port_count"] == "2"
    none = check(env, devices_include=["bnxt_re*"]).run()
    assert none.status is Status.SKIPPED


def test_roce_node_link_layer(tmp_path: Path) -> None:
    env = make_env(tmp_path, "roce_node.txt", Clock())
    ok = check(env, link_layer="Ethernet", expected_ports=2).run()
    assert ok.status is Status.OK
    assert list(samples(ok, "dgxdoctor_ib_port_info", device="mlx5_1")) == [
        ("mlx5_1", "1", "Ethernet", "Active", "LinkUp", "ens1f1np1")
    ]
    assert one(ok, "dgxdoctor_ib_port_events_total", device="mlx5_0", counter="np_cnp_sent") == 1200.0
    wrong = check(env, link_layer="InfiniBand").run()
    assert wrong.status is Status.WARNING
    assert codes(wrong)["IB_LINK_LAYER_MISMATCH"] == ["mlx5_0/1", "mlx5_1/1"]


def test_no_pma_port_reports_counters_unavailable_not_zero(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "no_pma.txt", clock)
    c = check(env)
    c.run()
    clock.t += 30
    result = c.run()
    assert result.status is Status.OK
    note = next(f for f in result.findings if f.code == "IB_COUNTERS_UNAVAILABLE")
    assert "N/A (no PMA)" in note.message
    assert "rxe0/1 counters partly unavailable" in result.summary  # said, not a plain OK
    assert samples(result, "dgxdoctor_ib_port_events_total", counter="symbol_error") == {}
    assert samples(result, "dgxdoctor_ib_port_rcv_bytes_per_second") == {}
    assert one(result, "dgxdoctor_ib_port_events_total", counter="sent_pkts") == 81240.0


def test_a_port_with_no_readable_counter_is_unknown_not_ok(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "no_pma.txt", clock)
    hw = tmp_path / "sys" / "class" / "infiniband" / "rxe0" / "ports" / "1" / "hw_counters"
    for f in hw.iterdir():
        f.unlink()  # only the N/A (no PMA) counters are left
    result = check(env).run()
    assert result.status is Status.UNKNOWN
    assert "rxe0/1 counters unavailable" in result.summary


# -- the check: counters over time -----------------------------------------------------------------------------


def test_data_rates_from_deltas_over_elapsed_time(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    clock.t += 30
    bump(env.sysfs_root, "mlx5_0", "port_rcv_data", 750_000_000)  # words
    bump(env.sysfs_root, "mlx5_0", "port_xmit_data", 1_500_000_000)
    result = c.run()
    assert one(result, "dgxdoctor_ib_port_rcv_bytes_per_second", device="mlx5_0") == 100_000_000.0
    assert one(result, "dgxdoctor_ib_port_xmit_bytes_per_second", device="mlx5_0") == 200_000_000.0
    assert one(result, "dgxdoctor_ib_port_rcv_bytes_per_second", device="mlx5_1") == 0.0
    assert one(result, "dgxdoctor_ib_port_errors_per_second", device="mlx5_0", counter="symbol_error") == 0.0
    assert result.status is Status.OK


def test_link_downed_increase_is_critical_and_flaps_are_remembered(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env, flap_warn_count=2)
    c.run()
    clock.t += 30
    bump(env.sysfs_root, "mlx5_3", "link_downed", 1)
    first = c.run()
    assert first.status is Status.CRITICAL
    assert codes(first)["IB_LINK_DOWNED"] == ["mlx5_3/1"]
    assert one(first, "dgxdoctor_ib_port_link_flaps", device="mlx5_3") == 1.0
    clock.t += 600
    bump(env.sysfs_root, "mlx5_3", "link_downed", 1)
    second = c.run()
    assert set(codes(second)) == {"IB_LINK_DOWNED", "IB_LINK_FLAPPING"}
    # A new process (daemon restart) still knows the flap history from the state file.
    clock.t += 30
    later = check(env, flap_warn_count=2).run()
    assert codes(later) == {"IB_LINK_FLAPPING": ["mlx5_3/1"]}
    assert later.status is Status.WARNING
    assert one(later, "dgxdoctor_ib_port_link_flaps", device="mlx5_3") == 2.0
    # Outside the window the flaps are forgotten.
    clock.t += 86400
    assert check(env, flap_warn_count=2).run().status is Status.OK


@pytest.mark.parametrize(
    "counter", ["excessive_buffer_overrun_errors", "local_link_integrity_errors", "rnr_nak_retry_err"]
)
def test_any_increase_of_fatal_counters_is_critical(tmp_path: Path, counter: str) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    clock.t += 30
    bump(env.sysfs_root, "mlx5_7", counter, 1)
    result = c.run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {f"IB_{counter.upper()}": ["mlx5_7/1"]}


def test_symbol_errors_over_120_per_hour_are_critical(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    statuses = []
    for _ in range(3):  # 50 every 30 s: 1.7/s is under the 10/s warning, but 150 in 90 s breaks 120/h
        clock.t += 30
        bump(env.sysfs_root, "mlx5_4", "symbol_error", 50)
        statuses.append(c.run().status)
    assert statuses == [Status.OK, Status.OK, Status.CRITICAL]
    clock.t += 30
    result = c.run()  # 30 s later, no new errors: still 150 within the hour
    assert result.status is Status.CRITICAL
    finding = next(f for f in result.findings if f.code == "IB_SYMBOL_ERROR")
    assert "rose by 150" in finding.message and "120 per hour" in finding.message


def test_slow_symbol_errors_under_the_ber_budget_are_not_flagged(tmp_path: Path) -> None:
    """One error a minute (60/h) must never be extrapolated into a breach, whatever the interval."""
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    for other in (env.sysfs_root / "class/infiniband").glob("mlx5_[!1]"):
        shutil.rmtree(other)  # never selected: 181 runs read one device's counters, not eight
    c = check(env, devices_include=["mlx5_1"])
    c.run()
    for _ in range(180):  # 90 minutes of 30 s runs: the hour window fills and rolls on
        clock.t += 30
        if int(clock.t) % 60 == 0:
            bump(env.sysfs_root, "mlx5_1", "symbol_error", 1)
        result = c.run()
        assert result.status is Status.OK, result.findings
    state = json.loads((env.state_dir / "infiniband.json").read_text())
    assert len(state["ports"]["mlx5_1/1"]["checkpoints"]) <= 62  # bounded history


def test_symbol_error_burst_rate_warns(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env, thresholds={"symbol_error_ber": {"enabled": False}})
    c.run()
    clock.t += 30
    bump(env.sysfs_root, "mlx5_0", "symbol_error", 600)  # 20/s
    result = c.run()
    assert result.status is Status.WARNING
    assert codes(result) == {"IB_SYMBOL_ERROR": ["mlx5_0/1"]}


def test_port_rcv_errors_and_discards_rates_warn(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    clock.t += 10
    bump(env.sysfs_root, "mlx5_0", "port_rcv_errors", 200)  # 20/s > 10/s
    bump(env.sysfs_root, "mlx5_1", "port_xmit_discards", 500)  # 50/s < 100/s
    bump(env.sysfs_root, "mlx5_2", "link_error_recovery", 6)  # 6 in 10 s > 5 per minute
    result = c.run()
    assert result.status is Status.WARNING
    assert codes(result) == {"IB_PORT_RCV_ERRORS": ["mlx5_0/1"], "IB_LINK_ERROR_RECOVERY": ["mlx5_2/1"]}
    assert one(result, "dgxdoctor_ib_port_errors_per_second", device="mlx5_0", counter="port_rcv_errors") == 20.0


def test_counter_reset_starts_a_new_baseline(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_degraded.txt", clock)
    c = check(env, devices_include=["mlx5_6"])
    c.run()
    clock.t += 30
    for name in ("symbol_error", "link_error_recovery", "port_rcv_errors", "port_rcv_data"):
        set_counter(env.sysfs_root, "mlx5_6", name, 0)  # perfquery -R
    result = c.run()
    assert result.status is Status.OK, result.findings
    assert samples(result, "dgxdoctor_ib_port_rcv_bytes_per_second") == {}
    assert all(v >= 0 for v in samples(result, "dgxdoctor_ib_port_errors_per_second").values())
    assert one(result, "dgxdoctor_ib_port_errors_per_second", counter="symbol_error") is None
    clock.t += 30
    bump(env.sysfs_root, "mlx5_6", "symbol_error", 3)
    after = c.run()
    assert one(after, "dgxdoctor_ib_port_errors_per_second", counter="symbol_error") == 0.1


def test_new_boot_id_starts_a_new_baseline(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    check(env).run()
    clock.t += 300
    set_boot(tmp_path, BOOT_B)  # rebooted: counters restarted, some already higher than before by chance
    bump(env.sysfs_root, "mlx5_0", "link_downed", 1)
    bump(env.sysfs_root, "mlx5_0", "symbol_error", 500)
    result = check(env).run()
    assert result.status is Status.OK, result.findings
    assert samples(result, "dgxdoctor_ib_port_errors_per_second") == {}
    state = json.loads((env.state_dir / "infiniband.json").read_text())
    assert state["boot_id"] == BOOT_B


def test_state_file_survives_restart_and_rates_continue(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    check(env).run()
    clock.t += 60
    bump(env.sysfs_root, "mlx5_2", "port_xmit_data", 15_000_000)
    result = check(env).run()  # a fresh instance: the baseline comes from the state file
    assert one(result, "dgxdoctor_ib_port_xmit_bytes_per_second", device="mlx5_2") == 1_000_000.0


def test_clock_going_backwards_is_a_new_baseline(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    clock.t -= 3600
    bump(env.sysfs_root, "mlx5_0", "link_downed", 1)
    result = c.run()
    assert result.status is Status.OK
    assert samples(result, "dgxdoctor_ib_port_errors_per_second") == {}


def test_corrupt_state_file_is_ignored(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    env.state_dir.mkdir(parents=True)
    (env.state_dir / "infiniband.json").write_text("{not json")
    assert check(env).run().status is Status.OK
    (env.state_dir / "infiniband.json").write_text(
        json.dumps({"version": 1, "boot_id": BOOT_A, "ports": {"mlx5_0/1": {"ts": "x", "counters": [1], "flaps": 3}}})
    )
    clock.t += 30
    assert check(env).run().status is Status.OK


def test_thresholds_from_config_override_defaults(tmp_path: Path) -> None:
    config = parse_config(
        {
            "checks": {
                "infiniband": {
                    "expected_ports": 8,
                    "thresholds": {
                        "symbol_error_ber": {
                            "counter": "symbol_error",
                            "kind": "rate",
                            "limit": 10,
                            "per": "hour",
                            "severity": "critical",
                        },
                    },
                }
            }
        }
    )
    settings = config.check_settings("infiniband")
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = InfinibandCheck(settings, env)
    assert c.rules["link_downed"].severity == "critical"  # untouched defaults stay
    c.run()
    clock.t += 30
    bump(env.sysfs_root, "mlx5_0", "symbol_error", 11)
    assert c.run().status is Status.CRITICAL


def test_bad_threshold_config_names_the_key() -> None:
    from dgxdoctor.config import ConfigError

    for table, says in (
        (
            {"thresholds": {"x": {"per": "week"}}},
            "Invalid enum value 'week' - at `$.checks.infiniband.thresholds[...].per`",
        ),
        ({"link_layer": "IB"}, "Invalid enum value 'IB' - at `$.checks.infiniband.link_layer`"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config({"checks": {"infiniband": table}})
        assert err.value.problems == [("checks.infiniband", says)]


def test_vanished_port_keeps_only_its_flaps(tmp_path: Path) -> None:
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    clock.t += 30
    bump(env.sysfs_root, "mlx5_7", "link_downed", 1)
    c.run()
    import shutil

    shutil.rmtree(env.sysfs_root / "class/infiniband/mlx5_7")
    clock.t += 30
    result = replace(c.run())
    assert result.facts["ib_port_count"] == "7"
    state = json.loads((env.state_dir / "infiniband.json").read_text())
    assert state["ports"]["mlx5_7/1"] == {"flaps": [clock.t - 30]}


def test_cli_check_over_a_sysfs_tree(tmp_path: Path) -> None:
    from conftest import run_cli

    sysfs = build_sysfs_tree(tmp_path / "sys", "dgx_ndr_degraded.txt")
    set_boot(tmp_path, BOOT_A)
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nsysfs_root = "{sysfs}"\nproc_root = "{tmp_path / "proc"}"\nstate_dir = "{tmp_path / "state"}"\n'
        "[checks.infiniband]\nexpected_ports = 8\nmin_rate_gbps = 400\n"
    )
    done = run_cli("check", "--config", str(cfg), "--only", "infiniband", "--json", env={"PATH": "/nonexistent"})
    assert done.returncode == 2, done.stderr
    (result,) = done.json()["checks"]
    assert result["status"] == "critical"
    assert {f["code"] for f in result["findings"]} >= {"IB_PORT_DOWN", "IB_PORT_RATE_LOW"}
    assert (tmp_path / "state" / "infiniband.json").is_file()


def test_unreadable_state_is_unknown_not_down(tmp_path: Path) -> None:
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", Clock())
    state = env.sysfs_root / "class/infiniband/mlx5_1/ports/1/state"
    state.unlink()
    state.mkdir()  # reading fails with an OSError
    result = check(env).run()
    assert result.status is Status.UNKNOWN
    assert codes(result) == {"IB_PORT_STATE_UNREADABLE": ["mlx5_1/1"]}
    assert one(result, "dgxdoctor_ib_port_up", device="mlx5_1") is None


def test_dual_port_device_maps_each_port_to_its_netdev(tmp_path: Path) -> None:
    root = build_sysfs_tree(tmp_path, "roce_node.txt")
    dev = root / "class/infiniband/mlx5_0"
    import shutil

    shutil.copytree(dev / "ports/1", dev / "ports/2")
    (dev / "device/net/ens1f0np1").mkdir()
    (dev / "device/net/ens1f0np1/dev_port").write_text("1\n")
    ports = [p for p in read_ports(root) if p.device == "mlx5_0"]
    assert [(p.port, p.netdev) for p in ports] == [(1, "ens1f0np0"), (2, "ens1f0np1")]

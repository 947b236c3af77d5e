"""The node-level IB rules live (rates across rails, firmware across HCAs from sysfs fw_ver), counters saturated at
their width (live and in a pasted perfquery), and the symbol-error budget per hour."""

from __future__ import annotations

from pathlib import Path

from test_infiniband import Clock, check, codes, make_env, one, set_counter

from conftest import run_cli
from dgxdoctor.result import Status

IB = Path(__file__).resolve().parents[1] / "fixtures" / "ib"


def test_one_rail_slow_and_firmware_skew_are_findings_live(tmp_path: Path) -> None:
    result = check(make_env(tmp_path, "dgx_ndr_one_rail_slow.txt", Clock())).run()
    by_code = {f.code: f for f in result.findings}
    rates = by_code["IB_PORT_RATES_DIFFER"]
    assert rates.status == Status.WARNING and "mlx5_3/1 200 Gb/s against 400 Gb/s" in rates.message
    firmware = by_code["IB_FIRMWARE_DIFFERS"]
    assert "28.37.1014: mlx5_6" in firmware.message and "28.39.1002: mlx5_0" in firmware.message
    assert result.status == Status.WARNING
    assert one(result, "dgxdoctor_ib_device_info", device="mlx5_6", fw_ver="28.37.1014") == 1.0


def test_healthy_rails_have_no_node_finding(tmp_path: Path) -> None:
    result = check(make_env(tmp_path, "dgx_ndr_healthy.txt", Clock())).run()
    assert "IB_PORT_RATES_DIFFER" not in codes(result) and "IB_FIRMWARE_DIFFERS" not in codes(result)
    assert result.status == Status.OK


def test_a_counter_at_its_width_is_named_saturated(tmp_path: Path) -> None:
    result = check(make_env(tmp_path, "dgx_ndr_one_rail_slow.txt", Clock())).run()
    (finding,) = [f for f in result.findings if f.code == "IB_COUNTER_SATURATED"]
    assert finding.subject == "mlx5_7/1" and "symbol_error = 65535 (at least)" in finding.message


def test_symbol_errors_over_120_an_hour_are_critical_live(tmp_path: Path) -> None:
    """NVSentinel's NIC health monitor: more than 120 symbol errors an hour breaks the IBTA BER budget (1e-12)."""
    clock = Clock()
    env = make_env(tmp_path, "dgx_ndr_healthy.txt", clock)
    c = check(env)
    c.run()
    clock.t += 1800
    set_counter(env.sysfs_root, "mlx5_0", "symbol_error", 121)
    result = c.run()
    (finding,) = [f for f in result.findings if f.code == "IB_SYMBOL_ERROR"]
    assert finding.status == Status.CRITICAL and "limit 120 per hour" in finding.message


def test_diagnose_names_a_saturated_perfquery_counter() -> None:
    done = run_cli("diagnose", str(IB / "perfquery_basic_symbol_errors_saturated.txt"), "--json")
    (doc,) = done.json()["inputs"]
    saturated = [f for f in doc["findings"] if f["code"] == "IB_COUNTER_SATURATED"]
    assert saturated and "symbol_error = 65535 (at least)" in saturated[0]["message"]

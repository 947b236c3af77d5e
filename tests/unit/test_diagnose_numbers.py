"""`diagnose` shows the figures it read and judges them with the checks' thresholds (``--config``)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.judge.infiniband import mixed_firmware_verdict, mixed_rates_verdict
from dgxdoctor.result import Status

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PROBE = FIX / "nccl_tests" / "h200_probe_allreduce.txt"
MIXED = FIX / "ib" / "ibstat_cx7_mixed_rate_firmware.txt"


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(body)
    return path


def test_human_output_shows_peak_average_and_transport() -> None:
    run = run_cli("diagnose", str(PROBE))
    assert run.returncode == 0, run.stderr
    assert "busbw peak 346.29 GB/s at 8 GiB, average 235.66 GB/s, 14 sizes" in run.stdout
    assert "transport not in the output" in run.stdout


def test_the_transport_nccl_named_is_shown() -> None:
    # NVIDIA/nccl#1066's NET/IB line (tests/fixtures/logs/lookalikes.log) before the probe's table
    line = (
        "gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/RoCE [RO]; "
        "OOB eno1np0:172.18.62.6<0>\n"
    )
    (d,) = diagnose(line + PROBE.read_text())
    assert d.kind == "nccl-tests" and d.summary is not None and d.summary.endswith("transport NET/IB")


def test_config_expected_busbw_is_judged_like_the_check(tmp_path: Path) -> None:
    config = write_config(tmp_path, "[checks.nccl]\nexpected_busbw_gbps = 600\n")
    run = run_cli("diagnose", "--json", "--config", str(config), str(PROBE))
    assert run.returncode == 2, run.stderr
    (doc,) = run.json()["inputs"]
    assert [f["code"] for f in doc["findings"]] == ["NCCL_BANDWIDTH_LOW"]
    assert "below 70% of the expected 600 GB/s" in doc["findings"][0]["message"]
    assert doc["summary"].startswith("busbw peak 346.29 GB/s")
    ok = run_cli(
        "diagnose", "--config", str(write_config(tmp_path, "[checks.nccl]\nexpected_busbw_gbps = 400\n")), str(PROBE)
    )
    assert ok.returncode == 0, ok.stdout


def test_config_min_rate_flags_a_slow_port(tmp_path: Path) -> None:
    config = write_config(tmp_path, "[checks.infiniband]\nmin_rate_gbps = 400\n")
    run = run_cli("diagnose", "--json", "--config", str(config), str(MIXED))
    (doc,) = run.json()["inputs"]
    codes = [f["code"] for f in doc["findings"]]
    assert codes == ["IB_PORT_RATE_LOW", "IB_PORT_RATES_DIFFER", "IB_FIRMWARE_DIFFERS"]
    assert doc["findings"][0]["subject"] == "mlx5_1/1"


def test_without_config_the_node_level_rules_still_apply() -> None:
    (d,) = diagnose(MIXED.read_text())
    assert [f.code for f in d.findings] == ["IB_PORT_RATES_DIFFER", "IB_FIRMWARE_DIFFERS"]
    assert d.status is Status.WARNING
    (healthy,) = diagnose((FIX / "ib" / "ibstat_cx7_ndr.txt").read_text())
    assert healthy.findings == ()


def test_config_ray_expectations(tmp_path: Path) -> None:
    dead = FIX / "ray" / "dead-ray-status.txt"
    assert run_cli("diagnose", str(dead)).returncode == 2
    config = write_config(tmp_path, "[checks.ray]\nexpected_nodes = 1\nexpected_gpus = 8\n")
    assert run_cli("diagnose", "--config", str(config), str(dead)).returncode == 0


def test_a_bad_config_is_a_config_error(tmp_path: Path) -> None:
    run = run_cli(
        "diagnose", "--config", str(write_config(tmp_path, "[checks.nccl]\nexpected_busbw_gbps = -1\n")), str(PROBE)
    )
    assert run.returncode not in (0, 1, 2, 3)
    assert "expected_busbw_gbps" in run.stderr


def test_mixed_verdicts_are_quiet_when_all_agree() -> None:
    assert mixed_rates_verdict({"mlx5_0/1": 400.0, "mlx5_1/1": 400.0}) is None
    assert mixed_firmware_verdict({"mlx5_0": "28.39.1002", "mlx5_1": "28.39.1002"}) is None

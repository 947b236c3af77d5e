"""`diagnose` reads nvidia-smi, nvidia-smi -q and nvidia-smi nvlink -s, judged by the gpu check's verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.sources.nvidia_smi import parse_nvlink_status, parse_query, parse_table

H200 = REPO / "docs" / "h200"
PASTES = FIXTURES / "nvidia_smi"


def codes(path: Path) -> tuple[str, dict[str, str]]:
    (reading,) = diagnose(path.read_text())
    return reading.kind, {f.code: f.status.value for f in reading.findings}


@pytest.mark.parametrize(
    ("name", "kind"),
    [("nvidia-smi.txt", "nvidia-smi"), ("nvidia-smi-q.txt", "nvidia-smi-q"), ("nvlink-s.txt", "nvidia-smi-nvlink")],
)
def test_the_projects_own_h200_captures_are_read_and_healthy(name: str, kind: str) -> None:
    (reading,) = diagnose((H200 / name).read_text())
    assert reading.kind == kind
    assert reading.findings == ()
    assert reading.summary == "2 GPUs (NVIDIA H200): healthy"


def test_query_is_read_into_the_nvml_snapshot() -> None:
    g0, g1 = parse_query((H200 / "nvidia-smi-q.txt").read_text())
    assert (g0.pci_bus_id, g1.pci_bus_id) == ("0000:00:06", "0000:00:07")
    assert g0.uuid == "GPU-7b512bdd-0fae-0dae-54a8-4e95615233cd"
    # R565+ offsets: T.Limit 51 C above 36 C -> max operating 87 C, slowdown 89 C, shutdown 95 C (NVML's absolutes)
    assert (g0.temperature_c, g0.max_operating_c, g0.slowdown_c, g0.shutdown_c) == (36, 87, 89, 95)
    assert g0.memory_total_bytes == 143771 << 20
    assert g0.clock_event_reasons == 0x001  # Idle
    assert g0.remapped_rows is not None and not g0.remapped_rows.pending
    assert (g0.ecc_volatile_uncorrected, g0.pcie_width_current, g0.recovery_action) == (0, 16, 0)


def test_query_faults_are_named_on_the_gpu_that_has_them() -> None:
    kind, found = codes(PASTES / "q_h200_gpu1_faults.txt")
    assert kind == "nvidia-smi-q"
    assert found.get("GPU_RECOVERY_ACTION") == "critical"
    assert "critical" in found.values()
    (reading,) = diagnose((PASTES / "q_h200_gpu1_faults.txt").read_text())
    assert {f.subject for f in reading.findings} == {"GPU-34f1ab61-96ed-a2c1-9e6f-02d36713f7aa"}  # the second GPU
    g1 = parse_query((PASTES / "q_h200_gpu1_faults.txt").read_text())[1]
    assert g1.remapped_rows is not None and g1.remapped_rows.pending and g1.ecc_volatile_uncorrected == 2
    assert g1.clock_event_reasons is not None and g1.clock_event_reasons & 0x040


def test_the_pre_r535_layout_is_read() -> None:
    (g,) = parse_query((PASTES / "q_r470_a100.txt").read_text())
    assert (g.slowdown_c, g.shutdown_c, g.temperature_c) == (89, 92, 88)
    assert g.power_w == 398.21 and g.power_limit_w == 400.0
    assert g.clock_event_reasons == 0x008 | 0x080
    assert (g.ecc_volatile_corrected, g.ecc_aggregate_corrected, g.pcie_width_current) == (12, 40, 8)
    kind, found = codes(PASTES / "q_r470_a100.txt")
    assert kind == "nvidia-smi-q"
    assert {"GPU_PCIE_WIDTH_DEGRADED"} <= set(found)


def test_table_err_is_a_gpu_nvml_cannot_read() -> None:
    rows = parse_table((PASTES / "table_h200_gpu1_err.txt").read_text())
    assert [r.snapshot.index for r in rows] == [0, 1]
    assert rows[0].errors == () and "ecc" in rows[1].errors and "temperature" in rows[1].errors
    kind, found = codes(PASTES / "table_h200_gpu1_err.txt")
    assert kind == "nvidia-smi"
    assert found == {"GPU_SMI_ERROR": "critical"}


def test_an_inactive_nvlink_is_critical() -> None:
    status = parse_nvlink_status((PASTES / "nvlink_h200_gpu1_link3_inactive.txt").read_text())
    assert len(status[0][2]) == 18 and status[1][2][3] == "<inactive>"
    kind, found = codes(PASTES / "nvlink_h200_gpu1_link3_inactive.txt")
    assert (kind, found) == ("nvidia-smi-nvlink", {"NVLINK_DOWN": "critical"})


def test_a_cut_query_still_shows_its_gpus() -> None:
    text = (H200 / "nvidia-smi-q.txt").read_text()
    cut = text[: text.index("GPU 00000000:00:07.0") + 2000]
    assert len(parse_query(cut)) == 2

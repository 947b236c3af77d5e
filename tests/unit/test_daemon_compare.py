from __future__ import annotations

from typing import Any

from dgxdoctor.fleet.compare import compare, imbalance_ratio
from dgxdoctor.result import Status

GIB = 2**30


def snap(node: str, samples: list[tuple[str, dict[str, str], float]] = (), **facts: str) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "node": node,
        "checks": [{"name": "x", "samples": [{"name": n, "labels": lab, "value": v} for n, lab, v in samples]}],
        "facts": {k.replace("__", "."): v for k, v in facts.items()},
    }


def gpus(util: float, mem_gib: float, count: int = 8) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for i in range(count):
        labels = {"gpu": str(i), "pci_bus_id": f"0000:{i:02x}:00.0"}
        out.append(("dgxdoctor_gpu_utilization_ratio", labels, util))
        out.append(("dgxdoctor_gpu_memory_used_bytes", labels, mem_gib * GIB))
    return out


def codes(result: Any) -> list[tuple[str, str | None]]:
    return [(f.code, f.subject) for f in result.findings]


def test_balanced_nodes_give_no_findings() -> None:
    out = compare([snap("a", gpus(0.9, 70)), snap("b", gpus(0.85, 68))])
    assert out.findings == ()
    ratios = {i.key: round(i.ratio, 3) for i in out.imbalances}
    assert ratios == {"gpu_memory_used": 0.029, "gpu_utilization": 0.056}


def test_only_one_node_busy_names_the_idle_node() -> None:
    # The tutorial's symptom: "only machine A moves" -> requests are not distributed.
    out = compare([snap("dgx-a", gpus(0.95, 70)), snap("dgx-b", gpus(0.02, 70))])
    assert codes(out) == [("PEER_GPU_UTILIZATION_IMBALANCE", "dgx-b")]
    f = out.findings[0]
    assert f.status is Status.WARNING and "dgx-b" in f.message and "ray" in (f.remedy or "")


def test_uneven_sharding_by_memory() -> None:
    out = compare([snap("a", gpus(0.9, 70)), snap("b", gpus(0.9, 20))])
    assert codes(out) == [("PEER_GPU_MEMORY_IMBALANCE", "b")]
    assert "uneven sharding" in out.findings[0].message


def test_idle_cluster_is_not_an_imbalance() -> None:
    out = compare([snap("a", gpus(0.05, 0.1)), snap("b", gpus(0.0, 0.01))])
    assert out.findings == ()


def test_ib_errors_per_rail_name_node_and_rail() -> None:
    def ib(rate0: float) -> list[tuple[str, dict[str, str], float]]:
        name = "dgxdoctor_ib_port_errors_per_second"
        return [
            (name, {"device": "mlx5_0", "port": "1", "counter": "symbol_error"}, rate0),
            (name, {"device": "mlx5_1", "port": "1", "counter": "symbol_error"}, 0.0),
        ]

    out = compare([snap("a", ib(0.0)), snap("b", ib(25.0))])
    assert codes(out) == [("PEER_IB_ERROR_IMBALANCE", "b mlx5_0/1")]
    assert {(i.key, i.rail) for i in out.imbalances} == {("ib_errors", "mlx5_0/1"), ("ib_errors", "mlx5_1/1")}


def test_one_sided_congestion_on_a_rail() -> None:
    def rx(v: float) -> list[tuple[str, dict[str, str], float]]:
        return [("dgxdoctor_ib_port_rcv_bytes_per_second", {"device": "mlx5_0", "port": "1"}, v)]

    out = compare([snap("a", rx(20e9)), snap("b", rx(3e9))])
    assert codes(out) == [("PEER_IB_RCV_IMBALANCE", "b mlx5_0/1")]
    assert "congestion" in out.findings[0].message


def test_version_skew_and_nccl_env_drift() -> None:
    a = snap(
        "a", driver_version="580.159.04", vllm_version="0.11.0", nccl_env__NCCL_IB_HCA="mlx5_0,mlx5_1",
        nccl_env__NCCL_IB_GID_INDEX="3", nccl_env__VLLM_HOST_IP="10.0.0.1", host_ip="10.0.0.1",
    )  # fmt: skip
    b = snap(
        "b", driver_version="570.86.10", vllm_version="0.11.0", nccl_env__NCCL_IB_HCA="mlx5_0,mlx5_1",
        nccl_env__VLLM_HOST_IP="10.0.0.2", host_ip="10.0.0.2",
    )  # fmt: skip
    out = compare([a, b])
    found = {f.code: f for f in out.findings}
    assert set(found) == {"PEER_VERSION_SKEW", "PEER_NCCL_ENV_DRIFT"}  # VLLM_HOST_IP and host_ip differ by design
    # Two nodes: no majority, so neither is the odd one (tests/unit/test_compare_verdict.py).
    assert found["PEER_VERSION_SKEW"].status is Status.CRITICAL and found["PEER_VERSION_SKEW"].subject is None
    assert "NCCL_IB_GID_INDEX" in found["PEER_NCCL_ENV_DRIFT"].message
    assert "(unset)" in found["PEER_NCCL_ENV_DRIFT"].message


def test_model_mismatch_is_critical_and_majority_names_the_odd_node() -> None:
    out = compare(
        [
            snap("a", model_fingerprint="sha256:1"),
            snap("b", model_fingerprint="sha256:2"),
            snap("c", model_fingerprint="sha256:1"),
        ]
    )
    assert codes(out) == [("PEER_MODEL_MISMATCH", "b")]
    assert out.findings[0].status is Status.CRITICAL


def test_fact_missing_on_one_node_is_not_drift() -> None:
    out = compare([snap("a", ray_version="2.60.0"), snap("b")])
    assert out.findings == () and out.compared_facts == 1  # only the agents' release (the same), not ray_version


def test_tolerance_override_and_single_node() -> None:
    pair = [snap("a", gpus(0.9, 70)), snap("b", gpus(0.6, 70))]
    assert codes(compare(pair)) == []
    assert codes(compare(pair, {"gpu_utilization": 0.2})) == [("PEER_GPU_UTILIZATION_IMBALANCE", "b")]
    assert compare([snap("a", gpus(0.9, 70))]).findings == ()


def test_imbalance_ratio() -> None:
    assert imbalance_ratio([0.0, 0.0]) == 0.0
    assert imbalance_ratio([10.0, 5.0]) == 0.5
    assert imbalance_ratio([4.0, 0.0, 2.0]) == 1.0


def test_drift_codes_by_kind_of_fact() -> None:
    a = snap("a", kernel_release="6.8.0-45", ib_port_rates_gbps="400,400", model_shard_sha256__x="1", site="x")
    b = snap("b", kernel_release="6.8.0-40", ib_port_rates_gbps="400,200", model_shard_sha256__x="2", site="y")
    found = {f.code: f.status for f in compare([a, b]).findings}
    assert found == {
        "PEER_VERSION_SKEW": Status.WARNING,
        "PEER_HARDWARE_DRIFT": Status.WARNING,
        "PEER_MODEL_MISMATCH": Status.CRITICAL,
        "PEER_FACT_DRIFT": Status.WARNING,
    }


def test_a_per_rail_nccl_probe_names_the_slow_rail_on_one_node() -> None:
    rail = "dgxdoctor_nccl_rail_busbw_bytes_per_second"

    def rails(slow: float) -> list[tuple[str, dict[str, str], float]]:
        return [(rail, {"device": f"mlx5_{i}", "port": "1"}, slow if i == 3 else 45e9) for i in range(8)]

    result = compare([snap("dgx-a", rails(45e9)), snap("dgx-b", rails(20e9))])
    bad = [f for f in result.findings if f.code == "PEER_NCCL_RAIL_IMBALANCE"]
    assert [f.subject for f in bad] == ["dgx-b mlx5_3/1"]


def stalled(node: str, util: float) -> dict[str, Any]:
    doc = snap(node, gpus(util, 70))
    doc["checks"].append({"name": "vllm", "samples": [], "findings": [{"code": "ENGINE_HUNG", "status": "critical"}]})
    return doc


def test_a_stalled_engine_names_the_node_whose_gpus_went_idle() -> None:
    """A TP rank stopped on dgx-b: both nodes' engines stall, dgx-a's GPUs spin in the collective, dgx-b's idle."""
    out = compare([stalled("dgx-a", 1.0), snap("dgx-b", gpus(0.0, 70))])
    stopped = [f for f in out.findings if f.code == "PEER_TP_RANK_STOPPED"]
    assert [(f.subject, f.status) for f in stopped] == [("dgx-b", Status.CRITICAL)]
    assert "dgx-a 100% spin" in stopped[0].message


def test_no_stall_or_no_clear_odd_node_names_nobody() -> None:
    assert "PEER_TP_RANK_STOPPED" not in {
        f.code for f in compare([snap("a", gpus(1.0, 70)), snap("b", gpus(0, 70))]).findings
    }
    both_idle = compare([stalled("a", 0.0), stalled("b", 0.0)])
    assert "PEER_TP_RANK_STOPPED" not in {f.code for f in both_idle.findings}

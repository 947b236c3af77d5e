"""A hang is its own signal: every external probe that times out is counted per check and probe, named in the
finding, and its counter exists at 0 before the first one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import httpx

from dgxdoctor.checks.base import CheckRunner, probe_labels
from dgxdoctor.checks.drift import DriftCheck
from dgxdoctor.checks.gpu import GpuCheck
from dgxdoctor.checks.infiniband import InfinibandCheck, InfinibandSettings
from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.checks.ray import RayCheck, RaySettings
from dgxdoctor.checks.topology import TopologyCheck, TopologySettings
from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.daemon.scheduler import CheckScheduler
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import Status
from dgxdoctor.sources.commands import CommandResult, CommandTimeout


def hangs(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
    raise CommandTimeout(f"{' '.join(argv)} did not finish in {timeout_s:g} s")


def env(tmp_path: Path, **kwargs: object) -> Environment:
    (tmp_path / "proc").mkdir(exist_ok=True)
    return Environment(
        node="dgx-a",
        sysfs_root=tmp_path,
        proc_root=tmp_path / "proc",
        state_dir=tmp_path,
        run_command=hangs,
        **kwargs,  # type: ignore[arg-type]
    )


def test_known_probes_per_check() -> None:
    assert probe_labels(GpuCheck) == ("nvml",)  # type: ignore[arg-type]
    assert probe_labels(RayCheck) == ("dashboard", "ray status", "run")  # type: ignore[arg-type]
    assert probe_labels(InfinibandCheck) == ("ibstat", "run")  # type: ignore[arg-type]
    assert probe_labels(DriftCheck) == ("version probe", "run")  # type: ignore[arg-type]
    assert probe_labels(PeerCompareCheck) == ("peer", "run")  # type: ignore[arg-type]


def test_nvidia_smi_that_hangs(tmp_path: Path) -> None:
    result = TopologyCheck(TopologySettings(), env(tmp_path)).run()
    assert result.status is Status.UNKNOWN and result.timeouts == ("nvidia-smi",)
    assert "nvidia-smi timed out" in result.findings[0].message


def test_ibstat_that_hangs(tmp_path: Path) -> None:
    result = InfinibandCheck(InfinibandSettings(), env(tmp_path)).run()
    assert result.timeouts == ("ibstat",)
    assert [f.code for f in result.findings] == ["IB_IBSTAT_TIMEOUT"]
    assert "ibstat timed out" in result.findings[0].message


def test_ray_dashboard_and_ray_status_that_hang(tmp_path: Path) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242/comm").write_text("gcs_server\n")
    (proc / "4242/stat").write_text("4242 (gcs_server) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0\n")
    (proc / "4242/cmdline").write_bytes(b"gcs_server\0")
    result = RayCheck(RaySettings(), env(tmp_path, http_transport=httpx.MockTransport(slow))).run()
    assert "dashboard" in result.timeouts
    assert "timed out" in result.summary or any("timed out" in f.message for f in result.findings)


def test_vllm_health_that_hangs(tmp_path: Path) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    check = VllmCheck(VllmSettings(required=True), env(tmp_path, http_transport=httpx.MockTransport(slow)))
    result = check.run()
    assert result.timeouts == ("health",)
    assert result.status is Status.CRITICAL


def test_peer_that_hangs(tmp_path: Path) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    local = {"node": "dgx-a", "status": "ok", "checks": [], "facts": {}}
    fleet = Fleet(lambda check: local, lambda: Peers(("http://dgx-b:9835",), None, 0.5))
    transport = httpx.MockTransport(slow)
    check = PeerCompareCheck(PeerCompareSettings(), env(tmp_path, http_transport=transport, fleet=fleet))
    result = check.run()
    assert result.timeouts == ("peer",)
    assert "timed out" in result.findings[0].message


async def test_counters_exist_at_zero_and_count_a_timeout(tmp_path: Path) -> None:
    store = ResultStore("dgx-a")
    e = env(tmp_path)
    sched = CheckScheduler(CheckRunner(e), store, heartbeat_s=60)
    sched.start()
    try:
        sched.add(TopologyCheck(TopologySettings(interval_s=3600), e))
        assert store.probe_timeouts()[("topology", "nvidia-smi")] == 0
        for _ in range(500):  # the first run starts at once
            if store.get("topology") is not None:
                break
            await asyncio.sleep(0.01)
        assert store.probe_timeouts()[("topology", "nvidia-smi")] == 1
        assert store.probe_timeouts()[("topology", "run")] == 0
    finally:
        sched.shutdown()

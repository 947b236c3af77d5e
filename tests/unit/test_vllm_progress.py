"""Forward progress of vLLM's engine: the clock, the follower between runs, the engine processes, the verdict."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from msgspec.structs import replace

from dgxdoctor.checks.vllm import VllmCheck, VllmSettings
from dgxdoctor.checks.vllm_progress import EngineWatch, ProgressClock, ProgressFollower
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.judge.vllm import DEFAULT_STALL_S, Observed, progress_finding
from dgxdoctor.result import Status
from dgxdoctor.sources.procfs import read_process
from dgxdoctor.sources.vllm_metrics import VllmMetrics, parse_vllm_metrics
from proctree import listen, write_process

API_PID, ENGINE_PID = 7538, 7573


def metrics(steps: float | None, running: float = 4, waiting: float = 0, tokens: float | None = None) -> VllmMetrics:
    return VllmMetrics(
        kv_cache_usage=0.5,
        num_requests_waiting=waiting,
        num_requests_running=running,
        preemptions_total=0,
        prompt_tokens_total=tokens,
        generation_tokens_total=tokens,
        ttft=None,
        itl=None,
        engine_steps_total=steps,
    )


def page(fixtures: Path, name: str) -> str:
    return (fixtures / "vllm" / f"metrics-0.32.0-{name}.txt").read_text()


def test_the_real_page_carries_every_progress_counter(fixtures: Path) -> None:
    m = parse_vllm_metrics(page(fixtures, "after-load"))
    assert m.engine_steps_total == 1735.0  # vllm:iteration_tokens_total_count
    assert m.requests_finished_total == 16.0  # vllm:request_success_total summed over finished_reason
    assert None not in m.progress_marks


def test_an_engine_step_without_a_token_is_progress() -> None:
    """A chunked prefill moves the step count before any token is counted: that is work, not a stall."""
    clock = ProgressClock()
    clock.observe(0.0, metrics(steps=10, tokens=100))
    clock.observe(5.0, metrics(steps=11, tokens=100))
    assert clock.stalled_s() == 0.0
    clock.observe(9.0, metrics(steps=11, tokens=100))
    assert clock.stalled_s() == 4.0


def test_idle_is_never_a_stall_and_a_page_without_counters_is_not_judged() -> None:
    clock = ProgressClock()
    clock.observe(0.0, metrics(steps=10, running=0))
    clock.observe(60.0, metrics(steps=10, running=0))
    assert clock.stalled_s() == 0.0
    assert not clock.loaded
    blind = ProgressClock()
    unknown = replace(metrics(steps=None, tokens=None), preemptions_total=None)
    blind.observe(0.0, unknown)
    blind.observe(60.0, unknown)
    assert blind.stalled_s() == 0.0


def observed(stalled: float, engines: tuple[str, ...] = (), stopped: bool = False) -> Observed:
    return Observed(metrics(steps=1), None, None, stalled, None, None, engines=engines, engine_stopped=stopped)


def test_verdict_thresholds() -> None:
    assert progress_finding(observed(0.0), DEFAULT_STALL_S, "u") is None
    warn = progress_finding(observed(4.0), DEFAULT_STALL_S, "u")
    assert warn is not None and (warn.code, warn.status) == ("ENGINE_NO_PROGRESS", Status.WARNING)
    hung = progress_finding(observed(DEFAULT_STALL_S, ("VLLM::EngineCore idle",)), DEFAULT_STALL_S, "u")
    assert hung is not None and (hung.code, hung.status) == ("ENGINE_HUNG", Status.CRITICAL)
    assert hung.evidence == "VLLM::EngineCore idle"
    stopped = progress_finding(observed(2.0, stopped=True), DEFAULT_STALL_S, "u")
    assert stopped is not None and stopped.code == "ENGINE_HUNG"
    assert "stopped" in stopped.message
    # stopped between two batches: its frozen gauges read idle, no stall is measured, it is hung all the same
    frozen_idle = progress_finding(observed(0.0, stopped=True), DEFAULT_STALL_S, "u")
    assert frozen_idle is not None and (frozen_idle.code, frozen_idle.status) == ("ENGINE_HUNG", Status.CRITICAL)


def test_engine_watch_reads_state_and_cpu_share(tmp_path: Path) -> None:
    now = [100.0]
    root = tmp_path / "proc"
    write_process(root, API_PID, "python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"])
    write_process(
        root, ENGINE_PID, "VLLM::EngineCor", ["VLLM::EngineCore" + " " * 40], state="R", utime=1000, ppid=API_PID
    )
    write_process(root, 7600, "python3", ["python3", "-m", "other"], state="R", utime=5000)
    watch = EngineWatch(root, lambda: now[0], lambda: read_process(root, API_PID))
    (first,) = watch.look()
    assert (first.pid, first.title, first.cpu_ratio) == (ENGINE_PID, "VLLM::EngineCore", None)
    now[0] += 2.0
    write_process(root, ENGINE_PID, "VLLM::EngineCor", ["VLLM::EngineCore"], state="R", utime=1200, ppid=API_PID)
    (spinning,) = watch.look()
    assert spinning.cpu_ratio == pytest.approx(1.0)  # 200 ticks at 100 Hz in 2 s: a full core
    write_process(root, ENGINE_PID, "VLLM::EngineCor", ["VLLM::EngineCore"], state="T", utime=1200, ppid=API_PID)
    (stopped,) = watch.look()
    assert "stopped (state T)" in stopped.describe()


class Source:
    def __init__(self) -> None:
        self.steps = 10.0
        self.fail: Exception | None = None

    def __call__(self) -> VllmMetrics:
        if self.fail is not None:
            raise self.fail
        return metrics(steps=self.steps)


def follower(tmp_path: Path, source: Source, now: list[float], wakes: list[float]) -> ProgressFollower:
    clock = ProgressClock()
    clock.observe(now[0], source())
    return ProgressFollower(
        fetch=source,
        clock=clock,
        engines=EngineWatch(tmp_path, lambda: now[0], lambda: None),
        monotonic=lambda: now[0],
        poll_s=2.0,
        thresholds=(7.5, 15.0),
        wake=lambda: wakes.append(now[0]),
    )


def test_follower_wakes_the_check_once_per_threshold_of_a_stall(tmp_path: Path) -> None:
    now, wakes, source = [0.0], [], Source()
    f = follower(tmp_path, source, now, wakes)
    for _ in range(20):  # 40 s of a frozen engine, read every 2 s
        now[0] += 2.0
        f.tick()
    assert wakes == [8.0, 16.0]  # the first reads at or past 7.5 s and 15 s of stall
    source.steps += 1  # it moves again: the next stall wakes again
    now[0] += 2.0
    f.tick()
    for _ in range(4):
        now[0] += 2.0
        f.tick()
    assert wakes == [8.0, 16.0, 50.0]


def test_follower_wakes_once_when_metrics_stop_answering(tmp_path: Path) -> None:
    now, wakes, source = [0.0], [], Source()
    f = follower(tmp_path, source, now, wakes)
    source.fail = httpx.ConnectError("[Errno 111] Connection refused")
    for _ in range(3):
        now[0] += 2.0
        f.tick()
    assert wakes == [2.0]


def test_daemon_check_follows_progress_and_a_stopped_engine_is_hung_at_once(fixtures: Path, tmp_path: Path) -> None:
    """In the daemon the follower reads between runs; a stopped engine process makes the first stall critical."""
    root = tmp_path / "proc"
    shutil.copytree(fixtures / "vllm" / "proc", root)
    listen(root, API_PID, 8000)  # the API server of the captured tree serves base_url's port
    now = [1000.0]
    pages = [page(fixtures, "engine-stopped")]
    woken: list[str] = []

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=pages[0])
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(200, text="")

    fleet = Fleet(local_state=lambda _: {}, peers=lambda: Peers((), None, 1.0), wake=woken.append)
    env = Environment(
        node="n1",
        proc_root=root,
        http_transport=httpx.MockTransport(serve),
        monotonic=lambda: now[0],
        one_shot=False,
        fleet=fleet,
    )
    check = VllmCheck(VllmSettings(canary="never", progress_poll_s=3600), env)
    check.start()
    try:
        check.run()  # 4 running, 3 waiting: the follower now has work to watch
        follower = check._follower
        assert follower is not None
        now[0] += 2.0
        follower.tick()  # no step in 2 s
        stat = root / str(ENGINE_PID) / "stat"
        stat.write_text(stat.read_text().replace(") S ", ") T ").replace(") R ", ") T "))
        now[0] += 2.0
        result = check.run()
    finally:
        check.stop()
    hung = next(f for f in result.findings if f.code == "ENGINE_HUNG")
    assert "an engine process is stopped" in hung.message
    assert "VLLM::EngineCore" in (hung.evidence or "")
    since = next(s.value for s in result.samples if s.metric.name == "dgxdoctor_vllm_seconds_since_progress")
    assert since == pytest.approx(4.0)

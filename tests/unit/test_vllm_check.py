"""The vllm check against a scripted HTTP server (httpx.MockTransport) and a copied proc tree of a real vLLM."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from dgxdoctor.checks.vllm import (
    VLLM_CANARY_TOKENS,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT_P99,
    VLLM_UP,
    VllmCheck,
    VllmSettings,
)
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.environment import Environment, Role
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.vllm_api import cmdline_port, is_vllm_api_server, is_vllm_process
from dgxdoctor.validation import validate
from proctree import write_process

API_PID, ENGINE_PID = 7538, 7573
BTIME = 1796003545
API_START = BTIME + 177008 / 100  # starttime field of the captured /proc/7538/stat


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeVllm:
    """Answers like vLLM: /health, /v1/models, /metrics (pages served in turn, the last repeats), completions."""

    def __init__(self, pages: list[str]) -> None:
        self.health: int | str = 200  # or "refused" / "timeout"
        self.models = ["tiny"]
        self.pages = list(pages)
        self.completion: tuple[int, Any] = (200, {"usage": {"prompt_tokens": 9, "completion_tokens": 4}})
        self.requests: list[httpx.Request] = []
        self.on_health: Callable[[], None] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/health":
            if self.on_health:
                self.on_health()
            if self.health == "refused":
                raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
            if self.health == "timeout":
                raise httpx.ReadTimeout("timed out", request=request)
            assert isinstance(self.health, int)
            return httpx.Response(self.health, text="")
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": m} for m in self.models]})
        if path == "/metrics":
            page = self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]
            return httpx.Response(200, text=page)
        if path == "/v1/chat/completions":
            code, body = self.completion
            return httpx.Response(code, json=body)
        return httpx.Response(404, json={"detail": "Not Found"})

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]


@pytest.fixture
def proc_root(tmp_path: Path, fixtures: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(fixtures / "vllm" / "proc", root)
    return root


@pytest.fixture
def empty_proc(tmp_path: Path, fixtures: Path) -> Path:
    root = tmp_path / "empty-proc"
    root.mkdir()
    shutil.copy(fixtures / "vllm" / "proc" / "stat", root / "stat")
    return root


def page(fixtures: Path, name: str) -> str:
    return (fixtures / "vllm" / f"metrics-0.32.0-{name}.txt").read_text()


def make(
    fake: FakeVllm,
    proc: Path,
    clock: Clock,
    *,
    uptime: float = 3600.0,
    one_shot: bool = True,
    role: Role | None = None,
    **settings: Any,
) -> VllmCheck:
    env = Environment(
        node="n1",
        role=role,
        proc_root=proc,
        http_transport=httpx.MockTransport(fake),
        clock=lambda: API_START + uptime,
        monotonic=clock.monotonic,
        one_shot=one_shot,
    )
    settings.setdefault("base_url", "http://127.0.0.1:18765")
    check = VllmCheck(validate(VllmSettings, settings), env)
    check._sleep = clock.sleep
    return check


def codes(result: CheckResult) -> set[str]:
    return {f.code for f in result.findings}


def sample(result: CheckResult, name: str) -> float | None:
    return next((s.value for s in result.samples if s.metric.name == name), None)


# ----- process recognition ------------------------------------------------------------------------------------


def test_vllm_command_lines() -> None:
    assert is_vllm_api_server(("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"))
    assert is_vllm_api_server(("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "/models/glm"))
    assert is_vllm_api_server(("python", "-m", "vllm.entrypoints.cli.main", "serve", "m"))
    assert not is_vllm_api_server(("python", "train.py", "--vllm"))
    assert is_vllm_process(("VLLM::EngineCore",))
    assert not is_vllm_process(("ray::RayWorkerWrapper",))
    assert cmdline_port(("vllm", "serve", "m", "--port", "8001")) == 8001
    assert cmdline_port(("vllm", "serve", "m", "--port=8002")) == 8002
    assert cmdline_port(("vllm", "serve", "m")) is None


# ----- up -----------------------------------------------------------------------------------------------------


def test_healthy_server_one_shot_with_canary(fixtures: Path, proc_root: Path) -> None:
    clock = Clock()
    fake = FakeVllm([page(fixtures, "idle")])
    result = make(fake, proc_root, clock, served_model_name="tiny").run()
    assert result.status is Status.OK, result
    assert result.findings == ()
    assert "model tiny" in result.summary and "canary 4 tokens" in result.summary
    assert fake.paths().count("/metrics") == 5  # the one-shot readings across oneshot_window_s
    assert fake.paths()[-1] == "/v1/chat/completions"
    body = json.loads(fake.requests[-1].content)
    assert body["model"] == "tiny" and body["max_tokens"] == 8
    assert sample(result, VLLM_UP.name) == 1
    assert sample(result, VLLM_KV_CACHE_USAGE.name) == 0.0
    assert sample(result, VLLM_CANARY_TOKENS.name) == 4
    assert sample(result, VLLM_TTFT_P99.name) is None  # no request in the window: absent
    assert {s.labels.get("model") for s in result.samples if s.metric.labels} == {"tiny"}


def test_api_key_is_sent_as_bearer(fixtures: Path, proc_root: Path) -> None:
    fake = FakeVllm([page(fixtures, "idle")])
    make(fake, proc_root, Clock(), api_key="s3cret", canary="never", oneshot_window_s=0).run()
    assert all(r.headers["authorization"] == "Bearer s3cret" for r in fake.requests)


def test_daemon_skips_the_canary_unless_always(fixtures: Path, proc_root: Path) -> None:
    fake = FakeVllm([page(fixtures, "idle")])
    make(fake, proc_root, Clock(), one_shot=False).run()
    assert "/v1/chat/completions" not in fake.paths()
    assert fake.paths().count("/metrics") == 1  # the daemon compares with its previous run instead
    make(fake, proc_root, Clock(), one_shot=False, canary="always").run()
    assert "/v1/chat/completions" in fake.paths()


def test_wrong_model_is_critical(fixtures: Path, proc_root: Path) -> None:
    fake = FakeVllm([page(fixtures, "idle")])
    result = make(fake, proc_root, Clock(), served_model_name="glm-5.3", canary="never").run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {"MODEL_NOT_SERVED"}


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        ((200, {"usage": {"completion_tokens": 0}}), "CANARY_EMPTY"),
        ((500, {"error": "EngineDeadError"}), "CANARY_FAILED"),
        ((200, {"choices": []}), "CANARY_FAILED"),
    ],
)
def test_canary_failures(fixtures: Path, proc_root: Path, completion: tuple[int, Any], code: str) -> None:
    fake = FakeVllm([page(fixtures, "idle")])
    fake.completion = completion
    result = make(fake, proc_root, Clock(), oneshot_window_s=0).run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {code}


def test_unreadable_metrics_is_a_warning_not_a_crash(proc_root: Path) -> None:
    fake = FakeVllm(["<html><body>404</body></html>"])
    result = make(fake, proc_root, Clock(), canary="never").run()
    assert result.status is Status.WARNING
    assert codes(result) == {"METRICS_UNREADABLE"}
    assert "not Prometheus text" in result.findings[0].message


# ----- not up ---------------------------------------------------------------------------------------------------


def test_nothing_here_is_skipped(empty_proc: Path) -> None:
    fake = FakeVllm([""])
    fake.health = "refused"
    result = make(fake, empty_proc, Clock()).run()
    assert result.status is Status.SKIPPED
    assert result.summary.startswith("no vLLM here")


def test_refused_when_required_is_dead(empty_proc: Path) -> None:
    fake = FakeVllm([""])
    fake.health = "refused"
    result = make(fake, empty_proc, Clock(), required=True).run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {"VLLM_DEAD"}
    assert "connection refused" in result.findings[0].message
    assert sample(result, VLLM_UP.name) == 0


def test_refused_with_a_vllm_process_is_dead(proc_root: Path) -> None:
    fake = FakeVllm([""])
    fake.health = "refused"
    result = make(fake, proc_root, Clock()).run()
    assert result.status is Status.CRITICAL
    assert "process 7538" in result.findings[0].message and "does not listen" in result.findings[0].message


def test_a_server_on_another_port_is_not_this_one(proc_root: Path) -> None:
    fake = FakeVllm([""])
    fake.health = "refused"
    # the captured API server runs with --port 18765; the engine has no port in its title and still counts
    result = make(fake, proc_root, Clock(), base_url="http://127.0.0.1:8000").run()
    assert result.status is Status.CRITICAL
    assert "process 7573" in result.findings[0].message


def test_loading_is_never_judged(proc_root: Path) -> None:
    for health in ("refused", "timeout", 503):
        fake = FakeVllm([""])
        fake.health = health
        result = make(fake, proc_root, Clock(), uptime=45, required=True).run()
        assert result.status is Status.OK, (health, result)
        assert codes(result) == {"VLLM_LOADING"}
        assert result.summary.startswith("vLLM loading (45 s of 900 s grace)")


def test_timeout_of_a_stopped_process_is_hung(proc_root: Path) -> None:
    stat = proc_root / str(API_PID) / "stat"
    stat.write_text(stat.read_text().replace(" (python) S ", " (python) T "))
    fake = FakeVllm([""])
    fake.health = "timeout"
    result = make(fake, proc_root, Clock(), pid_file=None).run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {"VLLM_HUNG"}
    assert "saturated or hung" in result.findings[0].message
    assert "is stopped (state T)" in result.findings[0].message


def test_timeout_of_a_busy_process_is_saturated(proc_root: Path) -> None:
    stat = proc_root / str(API_PID) / "stat"
    busy = stat.read_text().replace(" 638 75 ", " 938 75 ")  # 3 s of CPU while /health hung

    fake = FakeVllm([""])
    fake.health = "timeout"
    fake.on_health = lambda: stat.write_text(busy)
    result = make(fake, proc_root, Clock()).run()
    assert result.status is Status.WARNING
    assert codes(result) == {"VLLM_SATURATED"}
    assert "saturated or hung — saturated" in result.findings[0].message


def test_timeout_of_an_idle_process_is_hung(proc_root: Path) -> None:
    fake = FakeVllm([""])
    fake.health = "timeout"
    result = make(fake, proc_root, Clock()).run()
    assert result.status is Status.CRITICAL
    assert "hung: the API server was idle" in result.findings[0].message


def test_unhealthy_answer(proc_root: Path) -> None:
    fake = FakeVllm([""])
    fake.health = 503
    result = make(fake, proc_root, Clock()).run()
    assert result.status is Status.CRITICAL
    assert codes(result) == {"VLLM_UNHEALTHY"}


def test_pid_file(tmp_path: Path, proc_root: Path) -> None:
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text("424242\n")
    fake = FakeVllm([""])
    fake.health = "refused"
    result = make(fake, proc_root, Clock(), pid_file=pid_file).run()
    assert result.status is Status.CRITICAL
    assert "process 424242 from" in result.findings[0].message and "is gone" in result.findings[0].message
    pid_file.write_text(f"{API_PID}\n")
    assert make(fake, proc_root, Clock(), pid_file=pid_file, uptime=10).run().status is Status.OK  # loading


# ----- load, over time ------------------------------------------------------------------------------------------


def test_one_shot_under_pressure(fixtures: Path, proc_root: Path) -> None:
    fake = FakeVllm([page(fixtures, "full-kv")])
    result = make(fake, proc_root, Clock(), canary="never").run()
    assert result.status is Status.WARNING
    # the same page five times also means frozen counters: no progress in the 2 s
    assert codes(result) == {"KV_CACHE_HIGH", "QUEUE_WAITING", "ENGINE_NO_PROGRESS"}
    assert sample(result, VLLM_REQUESTS_WAITING.name) == 21


def test_daemon_needs_kv_sustained_and_queue_for_long(fixtures: Path, proc_root: Path) -> None:
    clock = Clock()
    fake = FakeVllm([page(fixtures, "full-kv")])
    check = make(
        fake, proc_root, clock, one_shot=False, kv_cache_sustained_s=120, waiting_sustained_s=120, stall_s=86400.0
    )
    first = check.run()
    assert codes(first) == set()  # one reading proves nothing sustained
    clock.t += 60
    assert codes(check.run()) == {"ENGINE_NO_PROGRESS"}  # (the page never changes)
    clock.t += 65
    late = check.run()
    assert codes(late) == {"KV_CACHE_HIGH", "QUEUE_WAITING", "ENGINE_NO_PROGRESS"}
    assert "averaged 100% over 125 s" in next(f.message for f in late.findings if f.code == "KV_CACHE_HIGH")
    # the queue empties: the waiting clock starts over
    fake.pages = [page(fixtures, "after-load")]
    clock.t += 15
    assert "QUEUE_WAITING" not in codes(check.run())


def test_frozen_counters_under_load_are_a_hung_engine(fixtures: Path, proc_root: Path) -> None:
    clock = Clock()
    fake = FakeVllm([page(fixtures, "engine-stopped")])  # 4 running, 3 waiting, counters frozen
    # one-shot: 2 s without progress is only a warning
    result = make(fake, proc_root, clock, canary="never").run()
    assert "ENGINE_NO_PROGRESS" in codes(result)
    assert result.status is Status.WARNING
    # the daemon: past stall_s it is critical, even though /health answers 200
    check = make(fake, proc_root, clock, one_shot=False, stall_s=60)
    check.run()
    clock.t += 30
    assert "ENGINE_NO_PROGRESS" in codes(check.run())
    clock.t += 31
    hung = check.run()
    assert hung.status is Status.CRITICAL
    assert "ENGINE_HUNG" in codes(hung)
    assert "/health still answers 200" in next(f.message for f in hung.findings if f.code == "ENGINE_HUNG")


def test_progress_between_runs_is_not_a_stall(fixtures: Path, proc_root: Path) -> None:
    clock = Clock()
    fake = FakeVllm([page(fixtures, "after-load"), page(fixtures, "engine-stopped")])
    check = make(fake, proc_root, clock, one_shot=False, stall_s=1)
    check.run()
    clock.t += 30
    assert not codes(check.run()) & {"ENGINE_HUNG", "ENGINE_NO_PROGRESS"}


def ttft_page(buckets: dict[str, float], tokens: float) -> str:
    lines = [
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1',
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}',
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    lines += [
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}'
        for le, c in buckets.items()
    ]
    return "\n".join(lines) + "\n"


def test_ttft_p99_jump_against_the_time_before_the_window(proc_root: Path) -> None:
    clock = Clock()
    # before: 1000 requests, all under 0.1 s; then 100 more, all between 1 and 2.5 s
    before = ttft_page({"0.1": 1000, "1.0": 1000, "2.5": 1000, "+Inf": 1000}, 5000)
    after = ttft_page({"0.1": 1000, "1.0": 1000, "2.5": 1100, "+Inf": 1100}, 9000)
    fake = FakeVllm([before, after])
    check = make(fake, proc_root, clock, one_shot=False, latency_min_requests=20, ttft_p99_max_s=2.0)
    check.run()
    clock.t += 60
    result = check.run()
    assert codes(result) == {"TTFT_P99_JUMP", "TTFT_P99_HIGH"}
    assert sample(result, VLLM_TTFT_P99.name) == pytest.approx(2.485)
    assert "TTFT p99 2.4" in result.summary


def test_a_restart_resets_the_windows(fixtures: Path, proc_root: Path) -> None:
    clock = Clock()
    fake = FakeVllm([page(fixtures, "full-kv")])
    check = make(fake, proc_root, clock, one_shot=False, kv_cache_sustained_s=60, stall_s=86400)
    check.run()
    fake.health = "refused"
    clock.t += 40
    assert check.run().status is Status.CRITICAL  # seen up before: refused now is dead
    fake.health = 200
    clock.t += 40
    assert "KV_CACHE_HIGH" not in codes(check.run())


# ----- settings -------------------------------------------------------------------------------------------------


def test_bad_settings_name_their_key() -> None:
    for key, value, says in (
        ("base_url", "localhost:8000", "is not an http(s)://HOST:PORT[/PATH] URL"),
        ("canary", "sometimes", "Invalid enum value 'sometimes'"),
        ("kv_cache_warn", 2, "Expected `float` <= "),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config({"checks": {"vllm": {key: value}}})
        [(table, reason)] = err.value.problems
        assert table == "checks.vllm" and reason.endswith(f" - at `$.checks.vllm.{key}`") and says in reason, reason


def test_settings_document_every_key() -> None:
    from msgspec import Meta
    from msgspec.structs import fields

    for field in fields(VllmSettings):
        assert any(isinstance(m, Meta) and m.description for m in field.type.__metadata__), field.name


def test_the_api_server_is_remembered_until_it_restarts(fixtures: Path, proc_root: Path) -> None:
    fake = FakeVllm([""])
    fake.health = "refused"
    check = make(fake, proc_root, Clock(), one_shot=False)
    assert "process 7538" in check.run().findings[0].message
    # the same pid, started later (pid reuse or a restart under the same pid): scanned again
    stat = proc_root / str(API_PID) / "stat"
    stat.write_text(stat.read_text().replace(" 177008 ", " 999999 "))
    (proc_root / str(API_PID) / "cmdline").write_bytes(b"sleep\0infinity\0")
    assert "process 7573" in check.run().findings[0].message


# ----- a headless worker of vLLM's multiprocessing executor across nodes ---------------------------------------

# vLLM 0.32.0's worker node of `--nnodes 2`: `vllm serve ... --node-rank 1 --headless` (vllm/entrypoints/cli/serve.py,
# run_headless) starts the ranks and no API server: nothing ever listens at base_url there.
MP_COMMON = ("/opt/vllm/bin/python3", "/opt/vllm/bin/vllm", "serve", "/models/glm", "--tensor-parallel-size", "16",
             "--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "29501")  # fmt: skip
HEADLESS = (*MP_COMMON, "--node-rank", "1", "--headless")
HEADLESS_REASON = "headless mp worker (node rank 1 of 2): serves no API; its health is the vllm_executor check"


def node_running(root: Path, argv: tuple[str, ...]) -> Path:
    """``root`` (its /proc/stat: btime) with one vLLM process started at API_START (uptime = make's ``uptime``)."""
    write_process(root, 4100, "python3", argv, start_ticks=177008)
    return root


@pytest.mark.parametrize("role", ["worker", None])
def test_a_headless_worker_past_the_start_grace_is_not_a_dead_server(empty_proc: Path, role: Role | None) -> None:
    root = node_running(empty_proc, HEADLESS)
    runs = ((3600, True, False), (3600, False, False), (45, True, False), (3600, True, True))
    for uptime, one_shot, required in runs:
        fake = FakeVllm([""])
        fake.health = "refused"
        result = make(fake, root, Clock(), uptime=uptime, one_shot=one_shot, role=role, required=required).run()
        assert (result.status, result.summary) == (Status.SKIPPED, HEADLESS_REASON), (uptime, one_shot, required)
        assert result.findings == () and fake.requests == []  # no API to ask: nothing asked


def test_a_python_m_headless_launch_with_flags_vllm_refuses(empty_proc: Path) -> None:
    argv = ("python3", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--nnodes", "two", "--headless")
    fake = FakeVllm([""])
    fake.health = "refused"
    result = make(fake, node_running(empty_proc, argv), Clock(), role="worker").run()
    assert result.status is Status.SKIPPED
    assert result.summary.startswith("headless vLLM (its parallel flags unreadable: --nnodes 'two'")


def test_a_headless_vllm_on_the_head_is_judged_as_ever(empty_proc: Path) -> None:
    """The head must serve the API: a headless vLLM there is dead as an API server (and a role mismatch)."""
    fake = FakeVllm([""])
    fake.health = "refused"
    result = make(fake, node_running(empty_proc, HEADLESS), Clock(), role="head").run()
    assert result.status is Status.CRITICAL and codes(result) == {"VLLM_DEAD"}
    assert "process 4100" in result.findings[0].message and "does not listen" in result.findings[0].message


def test_a_worker_node_that_is_not_headless_keeps_its_verdicts(empty_proc: Path, tmp_path: Path) -> None:
    """A Ray worker node runs no vLLM API server (its ranks are Ray actors): SKIPPED as before. A worker whose
    `vllm serve` has no --headless is an API server that does not listen: loading, then dead, as before."""
    fake = FakeVllm([""])
    fake.health = "refused"
    write_process(empty_proc, 4300, "ray::RayWorkerW", ("ray::RayWorkerWrapper",))
    ray_worker = make(fake, empty_proc, Clock(), role="worker").run()
    assert ray_worker.status is Status.SKIPPED and ray_worker.summary.startswith("no vLLM here")
    root = node_running(empty_proc, (*MP_COMMON, "--node-rank", "1"))
    loading = make(fake, root, Clock(), uptime=45, role="worker").run()
    assert codes(loading) == {"VLLM_LOADING"} and loading.status is Status.OK
    dead = make(fake, root, Clock(), uptime=3600, role="worker").run()
    assert dead.status is Status.CRITICAL and codes(dead) == {"VLLM_DEAD"}

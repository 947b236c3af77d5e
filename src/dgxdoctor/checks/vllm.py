"""vLLM over HTTP: /health, /v1/models, /metrics and a canary chat completion. vLLM is never imported here.

By hand::

    curl -s -m 5 -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8000/health
    curl -s http://127.0.0.1:8000/v1/models | python3 -m json.tool
    curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(kv_cache_usage_perc|gpu_cache_usage_perc|num_requests)'
    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "NAME", "messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 8}'

Verdicts: a refused connection means dead; a /health timeout means saturated (the API server is busy) or hung (it
is stopped or idle); /health 200 with requests running or waiting while no token counter advances means a hung
engine. Thresholds follow the operator tutorial's maintenance section: KV cache usage above 0.9 sustained, a
waiting queue non-zero for long, a jump of the TTFT P99. A server still loading (process younger than the start-up
grace) is never judged. A headless vLLM (``vllm serve ... --headless``, a worker node of the multiprocessing executor
across nodes) serves no API by design: the check is SKIPPED there, and the vllm_executor check judges that node.
A listener on base_url's port whose socket another user owns is never vLLM and never asked (``vllm_api.port_view``):
vLLM is then judged as not listening, the holder named. With ``[node] container`` the API server is the container's
(``sources.container.serving``), and its processes' users own the listener as the pid file's user does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.checks.vllm_progress import EngineWatch, ProgressFollower
from dgxdoctor.checks.vllm_window import MetricsWindow
from dgxdoctor.environment import Environment
from dgxdoctor.judge.vllm import (
    DEFAULT_KV_CACHE_WARN,
    DEFAULT_STALL_S,
    Down,
    Limits,
    Observed,
    Server,
    canary_findings,
    fmt_n,
    fmt_pct,
    headless,
    latency_findings,
    models_verdict,
    not_up,
    port_taken,
    pressure_findings,
    unreadable,
)
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder
from dgxdoctor.settings.bounds import DAY_S, HOUR_S
from dgxdoctor.sources.container import Serving, serving
from dgxdoctor.sources.procfs import CLK_TCK, ProcessInfo
from dgxdoctor.sources.prom_text import PromTextError
from dgxdoctor.sources.redact import shown_argv
from dgxdoctor.sources.vllm_api import (
    Health,
    PortHolder,
    cpu_ticks,
    foreign_listener,
    get_health,
    get_metrics,
    get_models,
    listener_trust,
    port_view,
    post_completion,
    process_from_pid_file,
    still_listening,
    user_process,
    vllm_by_command_line,
)
from dgxdoctor.sources.vllm_launch import LaunchError, is_headless_server, parse_launch
from dgxdoctor.sources.vllm_metrics import NotVllmMetrics, VllmMetrics
from dgxdoctor.validation import HttpUrl, Secret

if TYPE_CHECKING:
    import httpx

# `dgxdoctor check` reads /metrics this many times across oneshot_window_s: the KV cache of a saturated server
# oscillates (blocks freed and taken every step), so "sustained" is judged on the mean of several readings.
ONESHOT_READINGS = 5
# One run looks the container up several times (its processes, the listener's trust): one `docker inspect` serves them.
BOXED_TTL_S = 1.0

VLLM_UP = MetricSpec(
    "dgxdoctor_vllm_up", "1 when vLLM's /health answers 200; 0 when it refuses, times out, fails or is loading"
)
VLLM_HEALTH_LATENCY = MetricSpec("dgxdoctor_vllm_health_latency_seconds", "Time vLLM took to answer /health")
VLLM_PROCESS_UPTIME = MetricSpec(
    "dgxdoctor_vllm_process_uptime_seconds", "Age of the vLLM API server process (the start-up grace is keyed on it)"
)
VLLM_KV_CACHE_USAGE = MetricSpec(
    "dgxdoctor_vllm_kv_cache_usage_ratio",
    "KV cache usage 0..1 of the fullest engine (vllm:kv_cache_usage_perc, formerly vllm:gpu_cache_usage_perc)",
    labels=("model",),
)
VLLM_REQUESTS_WAITING = MetricSpec(
    "dgxdoctor_vllm_requests_waiting",
    "Requests queued, not yet scheduled (vllm:num_requests_waiting)",
    labels=("model",),
)
VLLM_REQUESTS_RUNNING = MetricSpec(
    "dgxdoctor_vllm_requests_running", "Requests being processed (vllm:num_requests_running)", labels=("model",)
)
VLLM_PREEMPTIONS = MetricSpec(
    "dgxdoctor_vllm_preemptions_total",
    "Requests preempted because the KV cache was full, since the server started (vllm:num_preemptions_total)",
    type="counter",
    labels=("model",),
)
VLLM_TTFT_P99 = MetricSpec(
    "dgxdoctor_vllm_ttft_p99_seconds",
    "99th percentile time to first token over the check's window, from histogram bucket deltas",
    labels=("model",),
)
VLLM_ITL_P99 = MetricSpec(
    "dgxdoctor_vllm_itl_p99_seconds",
    "99th percentile inter-token latency over the check's window, from histogram bucket deltas",
    labels=("model",),
)
VLLM_SECONDS_SINCE_PROGRESS = MetricSpec(
    "dgxdoctor_vllm_seconds_since_progress",
    "Seconds since vLLM's engine last made a step or counted a token while requests were running or waiting "
    "(0 when idle); ENGINE_HUNG at the vllm check's stall_s",
)
VLLM_CANARY_LATENCY = MetricSpec(
    "dgxdoctor_vllm_canary_latency_seconds", "Wall time of the canary chat completion", labels=("model",)
)
VLLM_CANARY_TOKENS = MetricSpec(
    "dgxdoctor_vllm_canary_completion_tokens",
    "usage.completion_tokens of the canary chat completion",
    labels=("model",),
)


class VllmSettings(CheckSettings, frozen=True):
    timeout_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="a run that takes longer is UNKNOWN (covers the canary)")
    ] = 90.0
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 15.0
    base_url: Annotated[HttpUrl, Meta(description="vLLM's OpenAI-compatible server on this node")] = HttpUrl(
        "http://127.0.0.1:8000"
    )
    required: Annotated[
        bool,
        Meta(
            description="vLLM must run here: a refused connection is CRITICAL even with no vLLM process on this node "
            "(otherwise it is SKIPPED as 'no vLLM here'); [node] role = \"head\" implies it. A headless vLLM (a "
            "worker of the mp executor across nodes) serves no API: SKIPPED either way"
        ),
    ] = False
    pid_file: Annotated[
        Path | None, Meta(description="pid file of the vLLM API server (default: find it by its command line in /proc)")
    ] = None
    served_model_name: Annotated[
        str | None, Meta(description="the --served-model-name that /v1/models must list (default: any model)")
    ] = None
    api_key: Annotated[Secret | None, Meta(description="vLLM's --api-key, sent as a Bearer token")] = None
    request_timeout_s: Annotated[
        float,
        Meta(
            gt=0, le=HOUR_S, description="timeout of /health, /v1/models and /metrics; a /health timeout is a verdict"
        ),
    ] = 5.0
    startup_grace_s: Annotated[
        float,
        Meta(
            ge=0,
            le=DAY_S,
            description="a vLLM process younger than this is loading (weights, profiling): not answering is OK then",
        ),
    ] = 900.0
    canary: Annotated[
        Literal["always", "never", "oneshot"],
        Meta(
            description="send a canary chat completion: always, never, or oneshot (in `dgxdoctor check`, not in the "
            "daemon's loop)"
        ),
    ] = "oneshot"
    canary_prompt: Annotated[str, Meta(min_length=1, description="the canary's user message")] = (
        "Reply with the word OK."
    )
    canary_max_tokens: Annotated[int, Meta(ge=1, le=4096, description="max_tokens of the canary")] = 8
    canary_timeout_s: Annotated[float, Meta(gt=0, le=HOUR_S, description="the canary must complete within this")] = 30.0
    oneshot_window_s: Annotated[
        float,
        Meta(
            ge=0,
            le=30,
            description="`dgxdoctor check`: seconds over which it reads /metrics 5 times (KV mean, forward progress, "
            "rates)",
        ),
    ] = 2.0
    kv_cache_warn: Annotated[
        float, Meta(gt=0, le=1, description="KV cache usage (0..1) that, as a mean, is a WARNING")
    ] = DEFAULT_KV_CACHE_WARN
    kv_cache_sustained_s: Annotated[
        float,
        Meta(ge=0, le=DAY_S, description="daemon: period over which the mean KV cache usage must reach kv_cache_warn"),
    ] = 120.0
    waiting_sustained_s: Annotated[
        float, Meta(ge=0, le=DAY_S, description="daemon: how long the waiting queue must stay non-zero to be a WARNING")
    ] = 120.0
    latency_window_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="daemon: window of the TTFT and ITL percentiles")
    ] = 300.0
    latency_min_requests: Annotated[
        int,
        Meta(
            ge=1,
            le=1000000,
            description="requests needed in the window before the TTFT P99 is compared with its baseline",
        ),
    ] = 20
    ttft_p99_jump_factor: Annotated[
        float,
        Meta(gt=1, le=1000, description="WARNING when the window's TTFT P99 exceeds this many times the P99 before it"),
    ] = 3.0
    ttft_p99_max_s: Annotated[
        Annotated[float, Meta(gt=0, le=HOUR_S)] | None,
        Meta(description="WARNING when the TTFT P99 exceeds this (seconds)"),
    ] = None
    itl_p99_max_s: Annotated[
        Annotated[float, Meta(gt=0, le=HOUR_S)] | None,
        Meta(description="WARNING when the inter-token latency P99 exceeds this (seconds)"),
    ] = None
    stall_s: Annotated[
        float,
        Meta(
            gt=0,
            le=DAY_S,
            description="requests running or waiting while no engine step or token is counted for this long: CRITICAL "
            "hung engine (docs/checks/vllm.md says why 15 s)",
        ),
    ] = DEFAULT_STALL_S
    progress_poll_s: Annotated[
        float,
        Meta(
            ge=0,
            le=HOUR_S,
            description="daemon: seconds between reads of vLLM's counters while requests are in flight, so a stall is "
            "judged the moment it crosses stall_s; 0 reads them only at the check's interval",
        ),
    ] = 2.0
    busy_cpu_ratio: Annotated[
        float,
        Meta(
            gt=0,
            le=1000,
            description="a /health timeout while the API server used at least this share of a CPU means saturated, "
            "below it hung",
        ),
    ] = 0.25


class VllmCheck(Check[VllmSettings]):
    """Health, model list, metrics (KV cache, queue, latency, forward progress) and a canary of one vLLM server.

    By hand: ``curl -s -m 5 -w '%{http_code}\\n' http://127.0.0.1:8000/health``, ``curl -s .../v1/models``,
    ``curl -s .../metrics | grep -E '^vllm:(kv_cache_usage_perc|num_requests_(running|waiting))'`` (see the module
    docstring for the canary request). Reads through ``sources/vllm_api.py``, remembers in ``vllm_window.py``,
    judges in ``judge/vllm.py``.
    """

    name: ClassVar[str] = "vllm"
    probes: ClassVar[tuple[str, ...]] = ("health", "models", "metrics", "canary")

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self._seen_up = False
        self._window = MetricsWindow(self.settings.latency_window_s, self.settings.kv_cache_sustained_s, env.one_shot)
        self._sleep: Callable[[float], None] = time.sleep  # tests advance a fake clock instead
        self._api_server: ProcessInfo | None = None
        self._server_lock = threading.Lock()  # the follower's thread and the runs both look the API server up
        self._boxed_lock = threading.Lock()
        self._boxed_at: tuple[float, Serving] | None = None
        self._engines = EngineWatch(env.proc_root, env.monotonic, self._serving_api_server)
        self._follower: ProgressFollower | None = None
        s = self.settings
        self._limits = Limits(
            request_timeout_s=s.request_timeout_s,
            startup_grace_s=s.startup_grace_s,
            busy_cpu_ratio=s.busy_cpu_ratio,
            kv_cache_warn=s.kv_cache_warn,
            stall_s=s.stall_s,
            latency_min_requests=s.latency_min_requests,
            ttft_p99_jump_factor=s.ttft_p99_jump_factor,
            ttft_p99_max_s=s.ttft_p99_max_s,
            itl_p99_max_s=s.itl_p99_max_s,
        )

    def start(self) -> None:
        """The daemon follows forward progress between runs (`dgxdoctor check` reads it within its own run)."""
        fleet, s = self.env.fleet, self.settings
        if self.env.one_shot or fleet is None or s.progress_poll_s <= 0 or self._follower is not None:
            return
        client = self.env.http_client(s.base_url, s.request_timeout_s)
        self._follower = ProgressFollower(
            fetch=lambda: self._follow_metrics(client),
            clock=self._window.progress,
            engines=self._engines,
            monotonic=self.env.monotonic,
            poll_s=s.progress_poll_s,
            thresholds=(s.stall_s / 2, s.stall_s),
            wake=lambda: fleet.wake(self.name),
            close=client.close,
        )
        self._follower.start()

    def stop(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()

    # ----- the outside world -------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}

    def _port(self) -> int:
        base = self.settings.base_url
        return urlsplit(base).port or (443 if base.startswith("https") else 80)

    def _trusted(self) -> frozenset[int]:
        trusted = listener_trust(self.env.proc_root, self.env.serving_uid, self.settings.pid_file)
        boxed = self._boxed()
        if boxed is not None:  # the container's processes, whatever their uid (a user namespace maps them)
            return trusted | {p.uid for p in boxed.members if p.uid is not None}
        return trusted

    def _boxed(self) -> Serving | None:
        """``[node] container``'s processes and its vLLM server (None when vLLM runs on the host); asked once per
        second at most (one run asks several times)."""
        box = self.env.container
        if box is None:
            return None
        with self._boxed_lock:
            now = self.env.monotonic()
            cached = self._boxed_at
            if cached is None or now - cached[0] >= BOXED_TTL_S:
                cached = self._boxed_at = (now, serving(self.env.run_command, self.env.proc_root, box))
            return cached[1]

    def _impostor(self) -> PortHolder | None:
        """Another user's listener where base_url connects (its answers are never vLLM's), else None."""
        host = urlsplit(self.settings.base_url).hostname
        return foreign_listener(self.env.proc_root, self._port(), host, self._trusted())

    def _follow_metrics(self, client: httpx.Client) -> VllmMetrics:
        """The follower's read: never another user's listener's /metrics (an error: the check then judges it)."""
        impostor = self._impostor()
        if impostor is not None:
            raise NotVllmMetrics(impostor.describe())
        return get_metrics(client, self._headers())

    def _serving_api_server(self) -> ProcessInfo | None:
        """The API server whose process tree holds the engines: the pid file's, else the process listening on
        base_url's port, remembered while the same process still listens there (no /proc scan every look)."""
        root = self.env.proc_root
        if self.settings.pid_file is not None:
            return process_from_pid_file(root, self.settings.pid_file)[0]
        boxed = self._boxed()
        if boxed is not None:
            return boxed.server
        with self._server_lock:
            cached = self._api_server
            if cached is not None:
                again = user_process(root, cached.pid)
                same = again is not None and again.start_ticks == cached.start_ticks
                if same and again is not None and still_listening(root, again, self._port()):
                    return again
            host = urlsplit(self.settings.base_url).hostname
            self._api_server = port_view(root, self._port(), host, self._trusted()).server
            return self._api_server

    def _find_process(self) -> tuple[ProcessInfo | None, str | None]:
        """The API server process; when no trusted user's process listens, a vLLM process found by its command
        line (loading, or dead with processes left), of root, our user or ``[node] serving_user`` only; and why
        none, if none."""
        if self.settings.pid_file is not None:
            return process_from_pid_file(self.env.proc_root, self.settings.pid_file)
        boxed = self._boxed()
        if boxed is not None:
            return boxed.server, None if boxed.server is not None else boxed.why_none()
        found = self._serving_api_server()
        if found is not None:
            return found, None
        return vllm_by_command_line(self.env.proc_root, self._port(), None, self.env.serving_uid)

    def _headless(self, proc: ProcessInfo | None) -> str | None:
        """Why there is no API to ask: the process found (nothing listens on base_url) is a headless vLLM."""
        if proc is None or not is_headless_server(proc.cmdline):
            return None
        try:
            return headless(self.env.role, parse_launch(proc.pid, proc.cmdline))
        except LaunchError as exc:
            return headless(self.env.role, None, str(exc))

    def _health(self, client: httpx.Client, proc: ProcessInfo | None) -> tuple[Health, float | None, str | None]:
        """/health, with the share of a CPU the API server used meanwhile and its state after."""
        root = self.env.proc_root
        before = cpu_ticks(root, proc.pid) if proc else None
        t0 = time.monotonic()
        health = get_health(client, self._headers())
        after = cpu_ticks(root, proc.pid) if proc else None
        ratio = None
        if before and after:
            ratio = (after[0] - before[0]) / CLK_TCK / max(time.monotonic() - t0, 1e-3)
        return health, ratio, after[1] if after else None

    # ----- the run -------------------------------------------------------------------------------------------

    def run(self) -> CheckResult:
        s = self.settings
        b = ResultBuilder(self.name)
        proc, no_proc_reason = self._find_process()
        not_served = self._headless(proc)
        if not_served is not None:
            self._window.reset()
            return CheckResult.skipped(self.name, not_served)
        uptime = None
        if proc is not None and proc.start_time is not None:
            uptime = max(0.0, self.env.clock() - proc.start_time)
        b.sample(VLLM_PROCESS_UPTIME, uptime)
        impostor = self._impostor()
        if impostor is not None:  # never asked: its /health, models and metrics are not vLLM's
            b.sample(VLLM_UP, 0)
            return self._down(b, port_taken(impostor.describe(), self._server(proc, no_proc_reason, uptime)))
        refused = self.env.refusal(s.base_url, s.request_timeout_s)
        if refused is not None:
            ticks = cpu_ticks(self.env.proc_root, proc.pid) if proc else None
            return self._not_up(
                b, Health("refused", refused), proc, no_proc_reason, uptime, None, ticks[1] if ticks else None
            )
        with self.env.http_client(s.base_url, s.request_timeout_s) as client:
            health, cpu_ratio, state = self._health(client, proc)
            if health.outcome == "timeout":
                b.timed_out("health")
            if health.outcome != "up":
                return self._not_up(b, health, proc, no_proc_reason, uptime, cpu_ratio, state)
            self._seen_up = True
            b.sample(VLLM_UP, 1)
            b.sample(VLLM_HEALTH_LATENCY, health.latency_s)
            parts = [f"vLLM up at {s.base_url}"]
            model = self._models(client, b, parts)
            self._metrics(client, b, parts, model)
            if self._canary_wanted():
                self._canary(client, b, parts, model)
        return b.build("; ".join(parts))

    def _not_up(
        self,
        b: ResultBuilder,
        health: Health,
        proc: ProcessInfo | None,
        no_proc_reason: str | None,
        uptime: float | None,
        cpu_ratio: float | None,
        state: str | None,
    ) -> CheckResult:
        b.sample(VLLM_UP, 0)
        server = self._server(proc, no_proc_reason, uptime, cpu_ratio, state)
        return self._down(b, not_up(health, server, self._limits))

    def _server(
        self,
        proc: ProcessInfo | None,
        no_proc_reason: str | None,
        uptime: float | None,
        cpu_ratio: float | None = None,
        state: str | None = None,
    ) -> Server:
        s = self.settings
        process = f"process {proc.pid} ({shown_argv(proc.cmdline, 80)})" if proc else None
        head = self.env.role == "head"
        expected = proc is not None or s.required or s.pid_file is not None or self._seen_up or head
        return Server(s.base_url, process, no_proc_reason, uptime, expected, cpu_ratio, state, head)

    def _down(self, b: ResultBuilder, down: Down) -> CheckResult:
        if not down.loading:
            self._window.reset()
        if down.skipped is not None:
            return CheckResult.skipped(self.name, down.skipped)
        b.add(*down.findings)
        return b.build(down.summary)

    def _models(self, client: httpx.Client, b: ResultBuilder, parts: list[str]) -> str | None:
        import httpx

        s = self.settings
        try:
            models = get_models(client, self._headers())
        except (httpx.HTTPError, ValueError) as exc:
            if isinstance(exc, httpx.TimeoutException):
                b.timed_out("models")
            b.add(unreadable("MODELS_UNREADABLE", "/v1/models", exc, s.base_url))
            return s.served_model_name
        findings, part, model = models_verdict(models, s.served_model_name, s.base_url)
        b.add(*findings)
        parts.append(part)
        return model

    def _read_metrics(self, client: httpx.Client) -> None:
        """One reading, or (one-shot) ONESHOT_READINGS spread over oneshot_window_s."""
        s = self.settings
        self._window.observe(get_metrics(client, self._headers()), self.env.monotonic())
        if self.env.one_shot and s.oneshot_window_s > 0:
            for _ in range(ONESHOT_READINGS - 1):
                self._sleep(s.oneshot_window_s / (ONESHOT_READINGS - 1))
                self._window.observe(get_metrics(client, self._headers()), self.env.monotonic())

    def _metrics(self, client: httpx.Client, b: ResultBuilder, parts: list[str], model: str | None) -> None:
        import httpx

        s = self.settings
        try:
            self._read_metrics(client)
        except (httpx.HTTPError, PromTextError, NotVllmMetrics) as exc:
            if isinstance(exc, httpx.TimeoutException):
                b.timed_out("metrics")
            b.add(unreadable("METRICS_UNREADABLE", "/metrics", exc, s.base_url))
            return
        stalled = self._window.progress.stalled_s()
        b.sample(VLLM_SECONDS_SINCE_PROGRESS, stalled)
        # The engine processes: the evidence of a stall, and a stopped engine is hung even when its frozen gauges
        # read idle (requests then wait in the API server, where no vllm: metric counts them).
        engines = self._engines.look()
        seen = self._window.observed(s.kv_cache_warn, s.waiting_sustained_s, engines)
        m = seen.metrics
        parts.append(
            f"KV cache {fmt_pct(m.kv_cache_usage)}, {fmt_n(m.num_requests_running)} running, "
            f"{fmt_n(m.num_requests_waiting)} waiting"
        )
        b.add(*pressure_findings(seen, self._limits, s.base_url))
        if seen.stats is not None:
            b.add(*latency_findings(seen.stats, seen.ttft_baseline_s, self._limits, s.base_url))
            if seen.stats.ttft_p99_s is not None:
                parts.append(f"TTFT p99 {seen.stats.ttft_p99_s:.3g} s")
        self._export(b, seen, model or (m.model_names[0] if m.model_names else ""))

    @staticmethod
    def _export(b: ResultBuilder, seen: Observed, model: str) -> None:
        m = seen.metrics
        b.sample(VLLM_KV_CACHE_USAGE, m.kv_cache_usage, model=model)
        b.sample(VLLM_REQUESTS_WAITING, m.num_requests_waiting, model=model)
        b.sample(VLLM_REQUESTS_RUNNING, m.num_requests_running, model=model)
        b.sample(VLLM_PREEMPTIONS, m.preemptions_total, model=model)
        if seen.stats is not None:
            b.sample(VLLM_TTFT_P99, seen.stats.ttft_p99_s, model=model)
            b.sample(VLLM_ITL_P99, seen.stats.itl_p99_s, model=model)

    def _canary_wanted(self) -> bool:
        mode = self.settings.canary
        return mode == "always" or (mode == "oneshot" and self.env.one_shot)

    def _canary(self, client: httpx.Client, b: ResultBuilder, parts: list[str], model: str | None) -> None:
        s = self.settings
        outcome = None
        if model is not None:
            headers = self._headers()
            outcome = post_completion(client, headers, model, s.canary_prompt, s.canary_max_tokens, s.canary_timeout_s)
        if outcome is not None and outcome.timed_out:
            b.timed_out("canary")
        findings = canary_findings(outcome, s.canary_timeout_s, s.base_url)
        b.add(*findings)
        if outcome is None or outcome.tokens is None:
            return
        b.sample(VLLM_CANARY_LATENCY, outcome.latency_s, model=model or "")
        b.sample(VLLM_CANARY_TOKENS, outcome.tokens, model=model or "")
        if not findings:
            parts.append(f"canary {outcome.tokens} tokens in {outcome.latency_s:.2f} s")

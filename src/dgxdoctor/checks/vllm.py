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
grace) is never judged.
"""

from __future__ import annotations

import errno
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import Field, SecretStr, field_validator

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.vllm import DEFAULT_KV_CACHE_WARN
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.procfs import CLK_TCK, ProcessInfo, iter_processes, read_process
from dgxdoctor.sources.prom_text import PromTextError
from dgxdoctor.sources.vllm_metrics import (
    NotVllmMetrics,
    VllmMetrics,
    WindowStats,
    parse_vllm_metrics,
    window_stats,
)

# `dgxdoctor check` reads /metrics this many times across oneshot_window_s: the KV cache of a saturated server
# oscillates (blocks freed and taken every step), so "sustained" is judged on the mean of several readings.
ONESHOT_READINGS = 5
MAX_BODY_CHARS = 300  # of an error body quoted in a finding

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
VLLM_CANARY_LATENCY = MetricSpec(
    "dgxdoctor_vllm_canary_latency_seconds", "Wall time of the canary chat completion", labels=("model",)
)
VLLM_CANARY_TOKENS = MetricSpec(
    "dgxdoctor_vllm_canary_completion_tokens",
    "usage.completion_tokens of the canary chat completion",
    labels=("model",),
)

# argv shapes of a vLLM API server: `python -m vllm.entrypoints.openai.api_server ...`, `vllm serve MODEL ...`
# (console script, argv[1] ends in /vllm), `python -m vllm.entrypoints.cli.main serve ...`.
API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")
# Titles vLLM gives its other processes with setproctitle: "VLLM::EngineCore", "VLLM::Worker_TP0" ...
VLLM_TITLE_PREFIX = "VLLM::"


def is_vllm_api_server(argv: tuple[str, ...]) -> bool:
    if any(arg in API_SERVER_MODULES for arg in argv):
        return True
    return any(Path(arg).name == "vllm" and nxt == "serve" for arg, nxt in itertools.pairwise(argv))


def is_vllm_process(argv: tuple[str, ...]) -> bool:
    return is_vllm_api_server(argv) or (bool(argv) and argv[0].startswith(VLLM_TITLE_PREFIX))


def _user_process(proc_root: Path, pid: int) -> ProcessInfo | None:
    """A process with a command line, its stat read now; None when gone, a zombie or a kernel thread."""
    info = read_process(proc_root, pid)
    return info if info is not None and info.cmdline else None


def cmdline_port(argv: tuple[str, ...]) -> int | None:
    """``--port N`` / ``--port=N`` from an argv, if given."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        if value is not None:
            # another user's process may write anything here; "²".isdigit() is True but int() refuses it
            return int(value) if value.isascii() and value.isdigit() and len(value) <= 5 else None
    return None


class VllmSettings(CheckSettings):
    timeout_s: float = Field(90.0, gt=0, description="a run that takes longer is UNKNOWN (covers the canary)")
    interval_s: float = Field(15.0, gt=0, description="daemon: seconds between runs")
    base_url: str = Field("http://127.0.0.1:8000", description="vLLM's OpenAI-compatible server on this node")
    required: bool = Field(
        False,
        description="vLLM must run here: a refused connection is CRITICAL even with no vLLM process on this node "
        "(otherwise it is SKIPPED as 'no vLLM here'); [node] role = \"head\" implies it",
    )
    pid_file: Path | None = Field(
        None, description="pid file of the vLLM API server (default: find it by its command line in /proc)"
    )
    served_model_name: str | None = Field(
        None, description="the --served-model-name that /v1/models must list (default: any model)"
    )
    api_key: SecretStr | None = Field(None, description="vLLM's --api-key, sent as a Bearer token")
    request_timeout_s: float = Field(
        5.0, gt=0, description="timeout of /health, /v1/models and /metrics; a /health timeout is a verdict"
    )
    startup_grace_s: float = Field(
        900.0,
        ge=0,
        description="a vLLM process younger than this is loading (weights, profiling): not answering is OK then",
    )
    canary: Literal["always", "never", "oneshot"] = Field(
        "oneshot",
        description="send a canary chat completion: always, never, or oneshot (in `dgxdoctor check`, not in the "
        "daemon's loop)",
    )
    canary_prompt: str = Field("Reply with the word OK.", min_length=1, description="the canary's user message")
    canary_max_tokens: int = Field(8, ge=1, le=4096, description="max_tokens of the canary")
    canary_timeout_s: float = Field(30.0, gt=0, description="the canary must complete within this")
    oneshot_window_s: float = Field(
        2.0,
        ge=0,
        le=30,
        description="`dgxdoctor check`: seconds over which it reads /metrics 5 times (KV mean, forward progress, "
        "rates)",
    )
    kv_cache_warn: float = Field(
        DEFAULT_KV_CACHE_WARN, gt=0, le=1, description="KV cache usage (0..1) that, as a mean, is a WARNING"
    )
    kv_cache_sustained_s: float = Field(
        120.0, ge=0, description="daemon: period over which the mean KV cache usage must reach kv_cache_warn"
    )
    waiting_sustained_s: float = Field(
        120.0, ge=0, description="daemon: how long the waiting queue must stay non-zero to be a WARNING"
    )
    latency_window_s: float = Field(300.0, gt=0, description="daemon: window of the TTFT and ITL percentiles")
    latency_min_requests: int = Field(
        20, ge=1, description="requests needed in the window before the TTFT P99 is compared with its baseline"
    )
    ttft_p99_jump_factor: float = Field(
        3.0, gt=1, description="WARNING when the window's TTFT P99 exceeds this many times the P99 before it"
    )
    ttft_p99_max_s: float | None = Field(None, gt=0, description="WARNING when the TTFT P99 exceeds this (seconds)")
    itl_p99_max_s: float | None = Field(
        None, gt=0, description="WARNING when the inter-token latency P99 exceeds this (seconds)"
    )
    stall_s: float = Field(
        60.0,
        gt=0,
        description="requests running or waiting while no token counter advances for this long: CRITICAL hung engine",
    )
    busy_cpu_ratio: float = Field(
        0.25,
        gt=0,
        description="a /health timeout while the API server used at least this share of a CPU means saturated, "
        "below it hung",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {value!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"base_url takes no query or fragment: {value!r}")
        return value.rstrip("/")


@dataclass(frozen=True)
class _Reading:
    t: float  # env.monotonic()
    metrics: VllmMetrics


@dataclass(frozen=True)
class _Health:
    outcome: Literal["up", "refused", "unreachable", "timeout", "http", "error"]
    detail: str
    latency_s: float | None = None
    status_code: int | None = None


def _is_refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == errno.ECONNREFUSED:
            return True
        if "refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _body_excerpt(response: httpx.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:MAX_BODY_CHARS] + ("..." if len(text) > MAX_BODY_CHARS else "")


def parse_models(payload: Any) -> list[str]:
    """The model ids of an OpenAI ``/v1/models`` answer. Raises ValueError naming what is wrong."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("/v1/models answer has no 'data' list")
    ids = []
    for item in payload["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise ValueError(f"/v1/models entry without a string 'id': {str(item)[:100]}")
        ids.append(item["id"])
    return ids


def parse_completion_tokens(payload: Any) -> int:
    """``usage.completion_tokens`` of a chat completion answer. Raises ValueError naming what is wrong."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise ValueError(f"chat completion answer has no integer usage.completion_tokens: {str(payload)[:200]}")
    return tokens


def _fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _fmt_n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


class VllmCheck(Check):
    """Health, model list, metrics (KV cache, queue, latency, forward progress) and a canary of one vLLM server.

    By hand: ``curl -s -m 5 -w '%{http_code}\\n' http://127.0.0.1:8000/health``, ``curl -s .../v1/models``,
    ``curl -s .../metrics | grep -E '^vllm:(kv_cache_usage_perc|num_requests_(running|waiting))'`` (see the module
    docstring for the canary request).
    """

    name: ClassVar[str] = "vllm"
    settings_model: ClassVar[type[CheckSettings]] = VllmSettings

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        settings = own_settings(self.name, settings, VllmSettings)
        self.settings: CheckSettings = settings  # the protocol's type: a mutable attribute is invariant
        self.cfg = settings
        self.env = env
        self._seen_up = False
        self._readings: deque[_Reading] = deque()
        self._kv: deque[tuple[float, float]] = deque()  # (monotonic time, KV cache usage)
        self._waiting_since: float | None = None
        self._progress_t: float | None = None  # last reading at which tokens advanced (or there was no load)
        self._window: WindowStats | None = None
        self._sleep: Callable[[float], None] = time.sleep  # tests advance a fake clock instead
        self._api_server: ProcessInfo | None = None

    def _reset(self) -> None:
        """The server went away: its counters and windows mean nothing for the next one."""
        self._readings.clear()
        self._kv.clear()
        self._waiting_since = self._progress_t = None

    # ----- the outside world -------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        key = self.cfg.api_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}

    def _find_process(self) -> tuple[ProcessInfo | None, str | None]:
        """The vLLM API server process (else any vLLM process), oldest first; and why none, if none."""
        root = self.env.proc_root
        pid_file = self.cfg.pid_file
        if pid_file is not None:
            try:
                raw = pid_file.read_text().strip()
            except OSError as exc:
                return None, f"pid file {pid_file}: {exc.strerror or exc}"
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 10):
                return None, f"pid file {pid_file} holds {raw[:40]!r}, not a pid"
            info = _user_process(root, int(raw))
            return (info, None) if info else (None, f"process {raw} from {pid_file} is gone")
        cached = self._api_server
        if cached is not None:
            # The API server found last time, if it is still the same process: no /proc scan every run.
            again = _user_process(root, cached.pid)
            if again is not None and again.start_ticks == cached.start_ticks:
                return again, None
            self._api_server = None
        port = urlsplit(self.cfg.base_url).port or (443 if self.cfg.base_url.startswith("https") else 80)
        # Processes that exit while listed (no stat line left) are skipped.
        found = [p for p in iter_processes(root) if is_vllm_process(p.cmdline) and p.stat is not None]
        # A server started with another --port is not the one this check watches.
        found = [p for p in found if cmdline_port(p.cmdline) in (None, port)]
        if not found:
            return None, "no vLLM process on this node"
        found.sort(key=lambda p: (not is_vllm_api_server(p.cmdline), p.start_time or 0.0))
        if is_vllm_api_server(found[0].cmdline):
            self._api_server = found[0]
        return found[0], None

    def _cpu_ticks(self, pid: int) -> tuple[int, str] | None:
        info = _user_process(self.env.proc_root, pid)
        return (info.stat.cpu_ticks, info.stat.state) if info and info.stat else None

    def _health(self, client: httpx.Client) -> _Health:
        t0 = time.monotonic()
        try:
            response = client.get("/health", headers=self._headers())
        except httpx.TimeoutException as exc:
            return _Health("timeout", f"{type(exc).__name__}")
        except httpx.ConnectError as exc:
            return _Health("refused" if _is_refused(exc) else "unreachable", str(exc) or type(exc).__name__)
        except httpx.HTTPError as exc:
            return _Health("error", f"{type(exc).__name__}: {exc}")
        latency = time.monotonic() - t0
        if response.status_code == 200:
            return _Health("up", "200", latency, 200)
        return _Health("http", f"{response.status_code} {_body_excerpt(response)}", latency, response.status_code)

    def _scrape(self, client: httpx.Client) -> VllmMetrics:
        response = client.get("/metrics", headers=self._headers())
        response.raise_for_status()
        return parse_vllm_metrics(response.text)

    # ----- the run -------------------------------------------------------------------------------------------

    def run(self) -> CheckResult:
        s = self.cfg
        b = ResultBuilder(self.name)
        self._window = None
        proc, no_proc_reason = self._find_process()
        uptime = None
        if proc is not None and proc.start_time is not None:
            uptime = max(0.0, self.env.clock() - proc.start_time)
        b.sample(VLLM_PROCESS_UPTIME, uptime)
        loading = proc is not None and uptime is not None and uptime < s.startup_grace_s

        with self.env.http_client(s.base_url, s.request_timeout_s) as client:
            before = self._cpu_ticks(proc.pid) if proc else None
            t_health = time.monotonic()
            health = self._health(client)
            after = self._cpu_ticks(proc.pid) if proc else None
            cpu_ratio = None
            if before and after:
                cpu_ratio = (after[0] - before[0]) / CLK_TCK / max(time.monotonic() - t_health, 1e-3)

            if health.outcome != "up":
                b.sample(VLLM_UP, 0)
                return self._not_up(b, health, proc, no_proc_reason, uptime, loading, cpu_ratio, after)

            self._seen_up = True
            b.sample(VLLM_UP, 1)
            b.sample(VLLM_HEALTH_LATENCY, health.latency_s)
            parts = [f"vLLM up at {s.base_url}"]
            model = self._models(client, b, parts)
            metrics = self._metrics(client, b, parts)
            label = model or (metrics.model_names[0] if metrics and metrics.model_names else "")
            if metrics is not None:
                self._export_metrics(b, metrics, label)
            if self._canary_wanted():
                self._canary(client, b, parts, model)
        summary = "; ".join(parts)
        return b.build(summary)

    def _not_up(
        self,
        b: ResultBuilder,
        health: _Health,
        proc: ProcessInfo | None,
        no_proc_reason: str | None,
        uptime: float | None,
        loading: bool,
        cpu_ratio: float | None,
        after: tuple[int, str] | None,
    ) -> CheckResult:
        s = self.cfg
        url = s.base_url
        what = {
            "refused": "connection refused",
            "unreachable": f"unreachable ({health.detail})",
            "timeout": f"/health did not answer in {s.request_timeout_s:g} s",
            "http": f"/health answered {health.detail}",
            "error": f"/health failed: {health.detail}",
        }[health.outcome]
        proc_text = f"process {proc.pid} ({' '.join(proc.cmdline)[:80]})" if proc else None
        if loading and proc is not None and uptime is not None:
            b.finding(
                "VLLM_LOADING",
                Status.OK,
                f"{proc_text} started {uptime:.0f} s ago, within the {s.startup_grace_s:g} s start-up grace: "
                f"still loading ({what})",
                url,
            )
            return b.build(f"vLLM loading ({uptime:.0f} s of {s.startup_grace_s:g} s grace): {what}")
        self._reset()
        head = self.env.role == "head"
        expected = proc is not None or s.required or s.pid_file is not None or self._seen_up or head
        if health.outcome in ("refused", "unreachable"):
            if not expected:
                return CheckResult.skipped(self.name, f"no vLLM here: nothing answers at {url} and {no_proc_reason}")
            where = f"{proc_text} exists but does not listen" if proc_text else (no_proc_reason or "no process")
            why = "; the head node ([node] role) must serve it" if head and proc is None else ""
            b.finding(
                "VLLM_DEAD",
                Status.CRITICAL,
                f"{what} at {url}: vLLM is dead ({where}){why}",
                url,
                remedy="vLLM is down: read the end of its log (`journalctl -u vllm -n 200`: OOM, NCCL or Ray errors), "
                "check `ray status` (both nodes, 16 GPUs), then `systemctl restart vllm`",
            )
            return b.build(f"vLLM dead: {what} at {url}")
        if health.outcome == "timeout":
            state = after[1] if after else None
            if state in ("T", "t"):
                verdict, status = f"hung: {proc_text} is stopped (state {state})", Status.CRITICAL
            elif cpu_ratio is not None and cpu_ratio >= s.busy_cpu_ratio:
                verdict = (
                    f"saturated: the API server was busy ({cpu_ratio * 100:.0f}% of a CPU) while it did not answer"
                )
                status = Status.WARNING
            elif cpu_ratio is not None:
                verdict = f"hung: the API server was idle ({cpu_ratio * 100:.0f}% of a CPU) meanwhile"
                status = Status.CRITICAL
            else:
                verdict, status = f"cannot tell which: {no_proc_reason or 'process unreadable'}", Status.CRITICAL
            b.finding(
                "VLLM_SATURATED" if status is Status.WARNING else "VLLM_HUNG",
                status,
                f"{what}: the server is saturated or hung — {verdict}",
                url,
                remedy="saturated: lower the client concurrency or add capacity; hung: take a stack dump "
                "(py-spy dump --pid PID) and the log, then restart vLLM",
            )
            return b.build(f"vLLM not answering: {what} ({verdict})")
        b.finding(
            "VLLM_UNHEALTHY",
            Status.CRITICAL,
            f"{what}: the engine reports itself unhealthy (an engine process died or errored)",
            url,
            remedy="read vLLM's log for the engine error (CUDA/NCCL/OOM), then restart vLLM",
        )
        return b.build(f"vLLM unhealthy: {what}")

    def _models(self, client: httpx.Client, b: ResultBuilder, parts: list[str]) -> str | None:
        s = self.cfg
        try:
            response = client.get("/v1/models", headers=self._headers())
            if response.status_code in (401, 403):
                raise ValueError(f"{response.status_code}: api_key missing or wrong")
            response.raise_for_status()
            models = parse_models(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            b.finding(
                "MODELS_UNREADABLE",
                Status.WARNING,
                f"/v1/models: {type(exc).__name__}: {exc}",
                s.base_url,
                remedy="check base_url and api_key in dgxdoctor's [checks.vllm] settings",
            )
            return s.served_model_name
        if s.served_model_name is not None and s.served_model_name not in models:
            b.finding(
                "MODEL_NOT_SERVED",
                Status.CRITICAL,
                f"/v1/models lists {models or 'nothing'}, not the configured {s.served_model_name!r}",
                s.base_url,
                remedy="vLLM serves another model than expected: check --served-model-name in the serve command",
            )
            parts.append(f"models {', '.join(models) or 'none'}")
            return models[0] if models else None
        model = s.served_model_name or (models[0] if models else None)
        parts.append(f"model {model}")
        return model

    def _metrics(self, client: httpx.Client, b: ResultBuilder, parts: list[str]) -> VllmMetrics | None:
        s = self.cfg
        try:
            self._observe(self._scrape(client))
            if self.env.one_shot and s.oneshot_window_s > 0:
                for _ in range(ONESHOT_READINGS - 1):
                    self._sleep(s.oneshot_window_s / (ONESHOT_READINGS - 1))
                    self._observe(self._scrape(client))
        except (httpx.HTTPError, PromTextError, NotVllmMetrics) as exc:
            detail = "timed out" if isinstance(exc, httpx.TimeoutException) else f"{exc}"
            b.finding(
                "METRICS_UNREADABLE",
                Status.WARNING,
                f"/metrics: {type(exc).__name__}: {detail}",
                s.base_url,
                remedy="check that base_url points at vLLM and that its metrics are not disabled",
            )
            return None
        self._judge(b, parts)
        return self._readings[-1].metrics

    def _observe(self, metrics: VllmMetrics) -> None:
        """Add a reading; keep the window (and one reading older than it, the delta's start)."""
        now = self.env.monotonic()
        prev = self._readings[-1] if self._readings else None
        self._readings.append(_Reading(now, metrics))
        horizon = now - self.cfg.latency_window_s
        while len(self._readings) > 2 and self._readings[1].t <= horizon:
            self._readings.popleft()

        s = self.cfg
        if metrics.kv_cache_usage is None:
            self._kv.clear()
        else:
            self._kv.append((now, metrics.kv_cache_usage))
            while len(self._kv) > 2 and self._kv[1][0] <= now - s.kv_cache_sustained_s:
                self._kv.popleft()
        if (metrics.num_requests_waiting or 0) > 0:
            self._waiting_since = self._waiting_since if self._waiting_since is not None else now
        else:
            self._waiting_since = None
        advanced = (
            prev is None
            or metrics.tokens_total is None
            or prev.metrics.tokens_total is None
            or metrics.tokens_total != prev.metrics.tokens_total
        )
        if advanced or not metrics.has_load or self._progress_t is None:
            self._progress_t = now

    def _kv_sustained(self) -> tuple[float, float] | None:
        """(mean usage, span) when the KV cache stayed at or above the threshold on average, like PromQL's
        ``avg_over_time(vllm:kv_cache_usage_perc[2m]) > 0.9``. The daemon needs readings spanning the whole period;
        `dgxdoctor check` judges the readings of its own run."""
        if not self._kv:
            return None
        now = self._kv[-1][0]
        need = self.cfg.kv_cache_sustained_s
        # _observe keeps the readings of the period plus the one just before it (its value held until the next).
        window = list(self._kv)
        if not self.env.one_shot and now - window[0][0] < need:
            return None
        mean = sum(v for _, v in window) / len(window)
        if mean < self.cfg.kv_cache_warn:
            return None
        return mean, now - window[0][0]

    def _sustained(self, since: float | None, need_s: float) -> float | None:
        """How long a condition has held, if it has held long enough (one-shot: across the whole run)."""
        if since is None:
            return None
        now = self._readings[-1].t
        held = now - since
        if self.env.one_shot:
            need_s = now - self._readings[0].t
        return held if held >= need_s else None

    def _judge(self, b: ResultBuilder, parts: list[str]) -> None:
        s = self.cfg
        url = s.base_url
        last = self._readings[-1]
        m = last.metrics
        parts.append(
            f"KV cache {_fmt_pct(m.kv_cache_usage)}, {_fmt_n(m.num_requests_running)} running, "
            f"{_fmt_n(m.num_requests_waiting)} waiting"
        )
        kv_held = self._kv_sustained()
        if kv_held is not None:
            mean, span = kv_held
            b.finding(
                "KV_CACHE_HIGH",
                Status.WARNING,
                f"KV cache usage averaged {_fmt_pct(mean)} over {span:.0f} s (now {_fmt_pct(m.kv_cache_usage)}), at or "
                f"above {_fmt_pct(s.kv_cache_warn)} ({m.kv_cache_metric})",
                url,
                remedy="scale out or lower the concurrency; more cache: --kv-cache-dtype fp8, a smaller "
                "--max-model-len, then --gpu-memory-utilization",
            )
        waiting_held = self._sustained(self._waiting_since, s.waiting_sustained_s)
        if waiting_held is not None:
            b.finding(
                "QUEUE_WAITING",
                Status.WARNING,
                f"waiting queue at {_fmt_n(m.num_requests_waiting)}, non-zero for {waiting_held:.0f} s",
                url,
                remedy="the concurrency cap is too low for the load: raise --max-num-seqs if the KV cache allows, "
                "or add capacity",
            )
        # Forward progress: /health can say 200 while the engine is stuck (a hung collective, a stopped worker).
        if m.has_load and self._progress_t is not None and len(self._readings) >= 2:
            stalled = last.t - self._progress_t
            if stalled > 0:
                load = f"{_fmt_n(m.num_requests_running)} running, {_fmt_n(m.num_requests_waiting)} waiting"
                hung = stalled >= s.stall_s
                b.finding(
                    "ENGINE_HUNG" if hung else "ENGINE_NO_PROGRESS",
                    Status.CRITICAL if hung else Status.WARNING,
                    f"no prompt or generation token counted for {stalled:.1f} s while {load} "
                    f"(/health still answers 200){': the engine is hung' if hung else ''}",
                    url,
                    remedy="the engine is stuck while /health answers: look for a hung NCCL collective or a dead Ray "
                    "worker (py-spy dump of the engine processes, `ray status`), then restart vLLM",
                )
        if len(self._readings) < 2:
            return  # one reading has no window: its histograms and counters hold the server's whole life
        oldest = self._readings[0]
        stats = window_stats(m, oldest.metrics, last.t - oldest.t)
        self._window = stats
        if stats.preemptions:
            b.finding(
                "KV_CACHE_PREEMPTIONS",
                Status.WARNING,
                f"{stats.preemptions:g} preemption(s) in the last {stats.span_s:.0f} s: the KV cache is too small for "
                "the load",
                url,
                remedy="lower the concurrency (--max-num-seqs) or give the KV cache more room (--kv-cache-dtype fp8, "
                "a smaller --max-model-len)",
            )
        if stats.ttft_p99_s is not None:
            parts.append(f"TTFT p99 {stats.ttft_p99_s:.3g} s")
            if s.ttft_p99_max_s is not None and stats.ttft_p99_s > s.ttft_p99_max_s:
                b.finding(
                    "TTFT_P99_HIGH",
                    Status.WARNING,
                    f"TTFT p99 {stats.ttft_p99_s:.3g} s over {stats.ttft_count:g} requests is above "
                    f"{s.ttft_p99_max_s:g} s",
                    url,
                    remedy="long inputs are crowding prefill: enable --enable-chunked-prefill, cap input length or "
                    "lower the concurrency",
                )
            baseline = window_stats(oldest.metrics, None, 0.0).ttft_p99_s
            if (
                baseline
                and stats.ttft_count >= s.latency_min_requests
                and stats.ttft_p99_s > s.ttft_p99_jump_factor * baseline
            ):
                b.finding(
                    "TTFT_P99_JUMP",
                    Status.WARNING,
                    f"TTFT p99 jumped to {stats.ttft_p99_s:.3g} s over the last {stats.span_s:.0f} s "
                    f"({stats.ttft_count:g} requests), {stats.ttft_p99_s / baseline:.1f}x the {baseline:.3g} s "
                    "before",
                    url,
                    remedy="a P99 jump usually means long inputs crowd prefill: enable --enable-chunked-prefill, "
                    "cap input length or lower the concurrency",
                )
        if stats.itl_p99_s is not None and s.itl_p99_max_s is not None and stats.itl_p99_s > s.itl_p99_max_s:
            b.finding(
                "ITL_P99_HIGH",
                Status.WARNING,
                f"inter-token latency p99 {stats.itl_p99_s:.3g} s is above {s.itl_p99_max_s:g} s",
                url,
                remedy="decode is slow: check GPU clocks and the inter-node link (TP all-reduce over IB), or lower "
                "the concurrency",
            )

    def _export_metrics(self, b: ResultBuilder, m: VllmMetrics, model: str) -> None:
        b.sample(VLLM_KV_CACHE_USAGE, m.kv_cache_usage, model=model)
        b.sample(VLLM_REQUESTS_WAITING, m.num_requests_waiting, model=model)
        b.sample(VLLM_REQUESTS_RUNNING, m.num_requests_running, model=model)
        b.sample(VLLM_PREEMPTIONS, m.preemptions_total, model=model)
        if self._window is not None:
            b.sample(VLLM_TTFT_P99, self._window.ttft_p99_s, model=model)
            b.sample(VLLM_ITL_P99, self._window.itl_p99_s, model=model)

    def _canary_wanted(self) -> bool:
        mode = self.cfg.canary
        return mode == "always" or (mode == "oneshot" and self.env.one_shot)

    def _canary(self, client: httpx.Client, b: ResultBuilder, parts: list[str], model: str | None) -> None:
        s = self.cfg
        url = s.base_url
        if model is None:
            b.finding(
                "CANARY_SKIPPED",
                Status.WARNING,
                "no canary: no model name (set served_model_name, or /v1/models must answer)",
                url,
            )
            return
        body = {
            "model": model,
            "messages": [{"role": "user", "content": s.canary_prompt}],
            "max_tokens": s.canary_max_tokens,
            "temperature": 0,
        }
        remedy = "the server answers /health but cannot complete a request: read vLLM's log, then restart it"
        t0 = time.monotonic()
        try:
            response = client.post(
                "/v1/chat/completions", json=body, headers=self._headers(), timeout=s.canary_timeout_s
            )
        except httpx.TimeoutException:
            b.finding(
                "CANARY_TIMEOUT",
                Status.CRITICAL,
                f"the canary chat completion did not finish in {s.canary_timeout_s:g} s",
                url,
                remedy=remedy,
            )
            return
        except httpx.HTTPError as exc:
            b.finding("CANARY_FAILED", Status.CRITICAL, f"canary: {type(exc).__name__}: {exc}", url, remedy=remedy)
            return
        latency = time.monotonic() - t0
        if response.status_code != 200:
            b.finding(
                "CANARY_FAILED",
                Status.CRITICAL,
                f"the canary chat completion answered {response.status_code}: {_body_excerpt(response)}",
                url,
                remedy=remedy,
            )
            return
        try:
            tokens = parse_completion_tokens(response.json())
        except (ValueError, json.JSONDecodeError) as exc:
            b.finding("CANARY_FAILED", Status.CRITICAL, f"canary: {exc}", url, remedy=remedy)
            return
        b.sample(VLLM_CANARY_LATENCY, latency, model=model)
        b.sample(VLLM_CANARY_TOKENS, tokens, model=model)
        if tokens <= 0:
            b.finding(
                "CANARY_EMPTY",
                Status.CRITICAL,
                f"the canary chat completion produced {tokens} tokens in {latency:.2f} s",
                url,
                remedy=remedy,
            )
            return
        parts.append(f"canary {tokens} tokens in {latency:.2f} s")

"""vLLM verdicts: KV cache, queue, preemptions, latency, progress; shared by ``checks/vllm.py`` and ``diagnose``."""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from dgxdoctor.environment import Role
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.vllm_api import Completion, Health
from dgxdoctor.sources.vllm_launch import Launch
from dgxdoctor.sources.vllm_metrics import VllmMetrics, WindowStats

# The tutorial's maintenance section: "KV Cache 使用率持续 > 0.9 就该扩容或降并发".
# KV cache usage (0..1) that, as a mean over the window, is a WARNING.
DEFAULT_KV_CACHE_WARN = 0.9

# Forward progress. A busy engine completes a step every few milliseconds to a few seconds: one step is at most a
# prefill chunk of --max-num-batched-tokens (chunked prefill is on by default in the V1 engine) plus one token for
# each running request; even a whole full-length prompt without chunking takes seconds, not tens of seconds, on the
# tutorial's H200s. Every step moves vllm:iteration_tokens_total's count, so 15 s without a single step while
# requests run or wait is not load but a stuck engine (a rank waiting in a collective that never completes). The
# daemon reads the counters every 2 s while requests are in flight, so ENGINE_HUNG comes at most ~19 s after the
# last step.
DEFAULT_STALL_S = 15.0


def snapshot_findings(
    m: VllmMetrics, kv_line: str | None = None, queue_line: str | None = None, kv_warn: float = DEFAULT_KV_CACHE_WARN
) -> list[Finding]:
    """What one ``/metrics`` snapshot shows (no history: "sustained" cannot be judged from it)."""
    findings: list[Finding] = []
    if m.kv_cache_usage is not None and m.kv_cache_usage >= kv_warn:
        findings.append(
            Finding(
                "KV_CACHE_HIGH",
                Status.WARNING,
                f"KV cache usage {m.kv_cache_usage * 100:.0f}% (at or above {kv_warn * 100:.0f}%); "
                "a problem when it stays there",
                evidence=kv_line,
                remedy="if sustained: scale out or lower the concurrency; more cache: --kv-cache-dtype fp8, a "
                "smaller --max-model-len, then --gpu-memory-utilization",
            )
        )
    if (m.num_requests_waiting or 0) > 0:
        findings.append(
            Finding(
                "QUEUE_WAITING",
                Status.WARNING,
                f"{m.num_requests_waiting:g} requests waiting ({m.num_requests_running or 0:g} running); a "
                "queue that stays non-zero means the concurrency cap is too low",
                evidence=queue_line,
                remedy="if it stays non-zero: raise --max-num-seqs if the KV cache allows, or add capacity",
            )
        )
    return findings


# ---- the live check's verdicts ---------------------------------------------------------------------------------

REMEDIES: Mapping[str, str] = {
    "VLLM_DEAD": "vLLM is down: read the end of its log (`journalctl -u vllm -n 200`: OOM, NCCL or Ray errors), "
    "check `ray status` (both nodes, all GPUs), then `systemctl restart vllm`",
    "VLLM_PORT_TAKEN": "another user's process holds vLLM's port: see whose (`ss -ltnp 'sport = :8000'`), stop "
    "it, then `systemctl restart vllm`; if it is this node's vLLM run as another user, set [node] serving_user",
    "VLLM_NOT_ANSWERING": "saturated: lower the client concurrency or add capacity; hung: take a stack dump "
    "(py-spy dump --pid PID) and the log, then restart vLLM",
    "VLLM_UNHEALTHY": "read vLLM's log for the engine error (CUDA/NCCL/OOM), then restart vLLM",
    "MODELS_UNREADABLE": "check base_url and api_key in dgxdoctor's [checks.vllm] settings",
    "MODEL_NOT_SERVED": "vLLM serves another model than expected: check --served-model-name in the serve command",
    "METRICS_UNREADABLE": "check that base_url points at vLLM and that its metrics are not disabled",
    "KV_CACHE_HIGH": "scale out or lower the concurrency; more cache: --kv-cache-dtype fp8, a smaller "
    "--max-model-len, then --gpu-memory-utilization",
    "QUEUE_WAITING": "the concurrency cap is too low for the load: raise --max-num-seqs if the KV cache allows, "
    "or add capacity",
    "ENGINE_STUCK": "the engine is stuck while /health answers: look for a hung NCCL collective or a dead Ray "
    "worker (py-spy dump of the VLLM::EngineCore and VLLM::Worker processes, `ray status`, the peer node's "
    "dgxdoctor), then restart vLLM",
    "KV_CACHE_PREEMPTIONS": "lower the concurrency (--max-num-seqs) or give the KV cache more room (--kv-cache-dtype "
    "fp8, a smaller --max-model-len)",
    "TTFT_P99_HIGH": "long inputs are crowding prefill: enable --enable-chunked-prefill, cap input length or "
    "lower the concurrency",
    "TTFT_P99_JUMP": "a P99 jump usually means long inputs crowd prefill: enable --enable-chunked-prefill, "
    "cap input length or lower the concurrency",
    "ITL_P99_HIGH": "decode is slow: check GPU clocks and the inter-node link (TP all-reduce over IB), or lower "
    "the concurrency",
    "CANARY": "the server answers /health but cannot complete a request: read vLLM's log, then restart it",
}


class Limits(Struct, frozen=True):
    """The thresholds of ``[checks.vllm]`` the verdicts read (see VllmSettings for each one's meaning)."""

    request_timeout_s: float
    startup_grace_s: float
    busy_cpu_ratio: float
    kv_cache_warn: float
    stall_s: float
    latency_min_requests: int
    ttft_p99_jump_factor: float
    ttft_p99_max_s: float | None
    itl_p99_max_s: float | None


class Server(Struct, frozen=True):
    """What is known of a server whose /health did not answer 200."""

    url: str
    process: str | None  # "process PID (argv)", when one was found
    no_process_reason: str | None
    uptime_s: float | None
    expected: bool  # a process runs, vLLM is required here, or it answered before
    cpu_ratio: float | None  # share of a CPU the API server used while /health was asked
    state: str | None  # its process state letter after the request
    head: bool = False  # the node's declared role is head: vLLM must be served here


class Observed(Struct, frozen=True):
    """What the /metrics window shows at its latest reading (``checks/vllm_window.py`` keeps the window)."""

    metrics: VllmMetrics  # the latest reading
    kv_held: tuple[float, float] | None  # (mean usage, span in s) when the mean reached kv_cache_warn
    waiting_held_s: float | None  # how long the queue has been non-zero, once that is long enough
    stalled_s: float | None  # seconds since tokens last advanced, while under load (None: not judged)
    stats: WindowStats | None  # over the window; None with a single reading
    ttft_baseline_s: float | None  # TTFT P99 of everything before the window
    engines: tuple[str, ...] = ()  # the engine processes as /proc shows them (state, CPU share), as evidence
    engine_stopped: bool = False  # one of them is stopped (SIGSTOP, a debugger): it cannot resume by itself


class Down(Struct, frozen=True):
    """The verdict on a server that did not answer: findings and summary, or the reason to skip."""

    findings: tuple[Finding, ...] = ()
    summary: str = ""
    skipped: str | None = None
    loading: bool = False


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def fmt_n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def _what(health: Health, limits: Limits) -> str:
    return {
        "refused": "connection refused",
        "unreachable": f"unreachable ({health.detail})",
        "timeout": f"/health did not answer in {limits.request_timeout_s:g} s",
        "http": f"/health answered {health.detail}",
        "error": f"/health failed: {health.detail}",
    }[health.outcome]


def _saturated_or_hung(server: Server, limits: Limits) -> tuple[str, Status]:
    """A /health timeout: a busy API server is saturated, a stopped or idle one is hung."""
    ratio = server.cpu_ratio
    if server.state in ("T", "t"):
        return f"hung: {server.process} is stopped (state {server.state})", Status.CRITICAL
    if ratio is not None and ratio >= limits.busy_cpu_ratio:
        return (
            f"saturated: the API server was busy ({ratio * 100:.0f}% of a CPU) while it did not answer",
            Status.WARNING,
        )
    if ratio is not None:
        return f"hung: the API server was idle ({ratio * 100:.0f}% of a CPU) meanwhile", Status.CRITICAL
    return f"cannot tell which: {server.no_process_reason or 'process unreadable'}", Status.CRITICAL


def headless(role: Role | None, launch: Launch | None, unreadable: str = "") -> str | None:
    """Why the check does not apply to this node's headless vLLM (``vllm serve ... --headless``: a worker node of
    the multiprocessing executor across nodes), whose ``launch`` is None when its flags are ``unreadable``.

    It serves no API by design: nothing answering at base_url is no verdict, at any age. Its process, ranks and
    the head's master are the vllm_executor check's, which also says when it is gone; the engine's progress is the
    head's vllm check's. None on a node declared head: the head must serve the API, so a headless vLLM there is
    judged as ever (vllm_executor's VLLM_MP_ROLE_MISMATCH names it).
    """
    if role == "head":
        return None
    if launch is None:
        what = f"headless vLLM (its parallel flags unreadable: {unreadable})"
    else:
        what = f"headless {launch.executor} worker (node rank {launch.node_rank} of {launch.nnodes})"
    return f"{what}: serves no API; its health is the vllm_executor check"


def not_up(health: Health, server: Server, limits: Limits) -> Down:
    """Loading (within the start-up grace), not here, dead, saturated, hung or unhealthy."""
    what, url = _what(health, limits), server.url
    if server.process is not None and server.uptime_s is not None and server.uptime_s < limits.startup_grace_s:
        grace, age = limits.startup_grace_s, server.uptime_s
        message = (
            f"{server.process} started {age:.0f} s ago, within the {grace:g} s start-up grace: still loading ({what})"
        )
        return Down(
            (Finding("VLLM_LOADING", Status.OK, message, url),),
            f"vLLM loading ({age:.0f} s of {grace:g} s grace): {what}",
            loading=True,
        )
    if health.outcome in ("refused", "unreachable"):
        if not server.expected:
            return Down(skipped=f"no vLLM here: nothing answers at {url} and {server.no_process_reason}")
        where = (
            f"{server.process} exists but does not listen"
            if server.process
            else (server.no_process_reason or "no process")
        )
        why = "; the head node ([node] role) must serve it" if server.head and server.process is None else ""
        message = f"{what} at {url}: vLLM is dead ({where}){why}"
        dead = Finding("VLLM_DEAD", Status.CRITICAL, message, url, remedy=REMEDIES["VLLM_DEAD"])
        return Down((dead,), f"vLLM dead: {what} at {url}")
    if health.outcome == "timeout":
        verdict, status = _saturated_or_hung(server, limits)
        code = "VLLM_SATURATED" if status is Status.WARNING else "VLLM_HUNG"
        message = f"{what}: the server is saturated or hung — {verdict}"
        found = Finding(code, status, message, url, remedy=REMEDIES["VLLM_NOT_ANSWERING"])
        return Down((found,), f"vLLM not answering: {what} ({verdict})")
    message = f"{what}: the engine reports itself unhealthy (an engine process died or errored)"
    unhealthy = Finding("VLLM_UNHEALTHY", Status.CRITICAL, message, url, remedy=REMEDIES["VLLM_UNHEALTHY"])
    return Down((unhealthy,), f"vLLM unhealthy: {what}")


def port_taken(holder: str, server: Server) -> Down:
    """Another user's process listens where base_url connects (``holder`` says whose): whatever it answers is not
    vLLM's, so it is never asked. vLLM is then what it is with nothing listening: dead where it is expected (a
    vLLM process of a trusted user, required here, the head, or it answered before; one still loading cannot
    bind the port either), else not here; never OK."""
    if not server.expected:
        return Down(skipped=f"no vLLM here: {holder}")
    where = f"; {server.process} does not listen" if server.process else ""
    why = "; the head node ([node] role) must serve it" if server.head and server.process is None else ""
    message = f"{holder}{where}: vLLM is dead at {server.url}{why}"
    dead = Finding("VLLM_DEAD", Status.CRITICAL, message, server.url, remedy=REMEDIES["VLLM_PORT_TAKEN"])
    return Down((dead,), f"vLLM dead: {holder}")


def models_verdict(models: list[str], wanted: str | None, url: str) -> tuple[list[Finding], str, str | None]:
    """(findings, summary part, the model to label and probe) for the ids ``/v1/models`` listed."""
    if wanted is not None and wanted not in models:
        message = f"/v1/models lists {models or 'nothing'}, not the configured {wanted!r}"
        found = Finding("MODEL_NOT_SERVED", Status.CRITICAL, message, url, remedy=REMEDIES["MODEL_NOT_SERVED"])
        return [found], f"models {', '.join(models) or 'none'}", models[0] if models else None
    model = wanted or (models[0] if models else None)
    return [], f"model {model}", model


def unreadable(code: str, what: str, error: BaseException, url: str) -> Finding:
    """``/v1/models`` or ``/metrics`` could not be read (a WARNING: /health said the server is up)."""
    import httpx

    detail = "timed out" if isinstance(error, httpx.TimeoutException) and code == "METRICS_UNREADABLE" else f"{error}"
    return Finding(code, Status.WARNING, f"{what}: {type(error).__name__}: {detail}", url, remedy=REMEDIES[code])


def pressure_findings(seen: Observed, limits: Limits, url: str) -> list[Finding]:
    """KV cache full on average, a queue that stays, no forward progress under load."""
    m = seen.metrics
    findings: list[Finding] = []
    if seen.kv_held is not None:
        mean, span = seen.kv_held
        message = (
            f"KV cache usage averaged {fmt_pct(mean)} over {span:.0f} s (now {fmt_pct(m.kv_cache_usage)}), at or "
            f"above {fmt_pct(limits.kv_cache_warn)} ({m.kv_cache_metric})"
        )
        findings.append(Finding("KV_CACHE_HIGH", Status.WARNING, message, url, remedy=REMEDIES["KV_CACHE_HIGH"]))
    if seen.waiting_held_s is not None:
        message = f"waiting queue at {fmt_n(m.num_requests_waiting)}, non-zero for {seen.waiting_held_s:.0f} s"
        findings.append(Finding("QUEUE_WAITING", Status.WARNING, message, url, remedy=REMEDIES["QUEUE_WAITING"]))
    stuck = progress_finding(seen, limits.stall_s, url)
    if stuck is not None:
        findings.append(stuck)
    return findings


def progress_finding(seen: Observed, stall_s: float, url: str) -> Finding | None:
    """Forward progress: /health can say 200 while the engine is stuck (a hung collective, a stopped worker).

    No engine step between two readings under load is a WARNING; ``stall_s`` or more is CRITICAL, and so is any
    stall while an engine process is stopped. The engine processes' state and CPU share are the evidence: stopped,
    idle (waiting on a peer rank) or spinning a full core (a collective that never completes).
    """
    stalled = seen.stalled_s or 0.0
    if stalled <= 0 and not seen.engine_stopped:
        return None
    m = seen.metrics
    load = f"{fmt_n(m.num_requests_running)} running, {fmt_n(m.num_requests_waiting)} waiting"
    # A stopped engine also freezes its own gauges (they may read idle): it is hung whatever they say.
    hung = stalled >= stall_s or seen.engine_stopped
    why = ": an engine process is stopped" if seen.engine_stopped else (": the engine is hung" if hung else "")
    message = f"no engine step or token counted for {stalled:.1f} s while {load} (/health still answers 200){why}"
    code, status = ("ENGINE_HUNG", Status.CRITICAL) if hung else ("ENGINE_NO_PROGRESS", Status.WARNING)
    evidence = "; ".join(seen.engines) or None
    return Finding(code, status, message, url, evidence=evidence, remedy=REMEDIES["ENGINE_STUCK"])


def latency_findings(stats: WindowStats, ttft_baseline_s: float | None, limits: Limits, url: str) -> list[Finding]:
    """Over the window: preemptions, TTFT P99 above its limit or jumped against the P99 before, ITL P99."""
    findings: list[Finding] = []
    span = f"{stats.span_s:.0f} s"
    if stats.preemptions:
        message = f"{stats.preemptions:g} preemption(s) in the last {span}: the KV cache is too small for the load"
        findings.append(
            Finding("KV_CACHE_PREEMPTIONS", Status.WARNING, message, url, remedy=REMEDIES["KV_CACHE_PREEMPTIONS"])
        )
    ttft, most = stats.ttft_p99_s, limits.ttft_p99_max_s
    if ttft is not None and most is not None and ttft > most:
        message = f"TTFT p99 {ttft:.3g} s over {stats.ttft_count:g} requests is above {most:g} s"
        findings.append(Finding("TTFT_P99_HIGH", Status.WARNING, message, url, remedy=REMEDIES["TTFT_P99_HIGH"]))
    base = ttft_baseline_s
    if (
        ttft is not None
        and base
        and stats.ttft_count >= limits.latency_min_requests
        and ttft > limits.ttft_p99_jump_factor * base
    ):
        message = (
            f"TTFT p99 jumped to {ttft:.3g} s over the last {span} ({stats.ttft_count:g} requests), "
            f"{ttft / base:.1f}x the {base:.3g} s before"
        )
        findings.append(Finding("TTFT_P99_JUMP", Status.WARNING, message, url, remedy=REMEDIES["TTFT_P99_JUMP"]))
    itl, most = stats.itl_p99_s, limits.itl_p99_max_s
    if itl is not None and most is not None and itl > most:
        message = f"inter-token latency p99 {itl:.3g} s is above {most:g} s"
        findings.append(Finding("ITL_P99_HIGH", Status.WARNING, message, url, remedy=REMEDIES["ITL_P99_HIGH"]))
    return findings


def canary_findings(outcome: Completion | None, timeout_s: float, url: str) -> list[Finding]:
    """The canary chat completion: ``None`` when there was no model name to send it to."""
    remedy = REMEDIES["CANARY"]
    if outcome is None:
        message = "no canary: no model name (set served_model_name, or /v1/models must answer)"
        return [Finding("CANARY_SKIPPED", Status.WARNING, message, url)]
    if outcome.timed_out:
        message = f"the canary chat completion did not finish in {timeout_s:g} s"
        return [Finding("CANARY_TIMEOUT", Status.CRITICAL, message, url, remedy=remedy)]
    if outcome.error is not None or outcome.tokens is None:
        return [Finding("CANARY_FAILED", Status.CRITICAL, outcome.error or "canary: no answer", url, remedy=remedy)]
    if outcome.tokens <= 0:
        message = f"the canary chat completion produced {outcome.tokens} tokens in {outcome.latency_s:.2f} s"
        return [Finding("CANARY_EMPTY", Status.CRITICAL, message, url, remedy=remedy)]
    return []

"""The actions: argv lists run without a shell and with a timeout, then a verification of the service.

``restart_vllm`` runs one command and verifies. ``restart_cluster`` follows the runbook's order: stop vLLM,
``ray stop`` on the workers (asked over their authenticated API) and here, start the head, start the workers,
wait until Ray has every node and GPU, start vLLM, verify. A failed step ends the action as failed; so does a
failed verification: ``/health`` 200, the model listed by ``/v1/models``, a real chat completion with tokens.
Everything here blocks: the engine runs it in a worker thread.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
from msgspec import Meta, Struct

from dgxdoctor.remediation.state_doc import Finite, Step
from dgxdoctor.sources.commands import CommandNotFound, CommandRunner, CommandTimeout
from dgxdoctor.sources.container import Container, serving
from dgxdoctor.sources.ray_api import RayApiError, parse_nodes_detail
from dgxdoctor.sources.vllm_api import foreign_listener, listener_trust

OUTPUT_TAIL = 400  # characters of a command's output kept in the audit
POLL_S = 0.25
STEP_PATH = "/remediation/step"
# A step request older or newer than this (by the worker's clock) is refused: NTP keeps nodes within a second;
# a request recorded on the wire and replayed later never runs.
STEP_WINDOW_S = 120.0


def step_mac(token: str, step: str, action_id: str, sent_at: float) -> str:
    """HMAC-SHA256 under the shared token of what a step request asks: the step, the action and when."""
    message = f"dgxdoctor-step\n{step}\n{action_id}\n{sent_at:.6f}".encode()
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).hexdigest()


class StepRequest(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``POST /remediation/step``'s body, exactly."""

    step: Step
    id: Annotated[str, Meta(pattern=r"^[0-9a-f]{12,64}\Z")]
    ts: Finite
    mac: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]

    def signed_by(self, token: str) -> bool:
        return hmac.compare_digest(self.mac, step_mac(token, self.step, self.id, self.ts))


class StepResult(Struct, frozen=True):
    step: str
    ok: bool
    detail: str
    duration_s: float
    argv: tuple[str, ...] = ()
    returncode: int | None = None

    def to_doc(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "ok": self.ok,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
            "argv": list(self.argv),
            "returncode": self.returncode,
        }


def run_argv(step: str, argv: Sequence[str], timeout_s: float, runner: CommandRunner) -> StepResult:
    """Run ``argv`` through ``runner`` (``Environment.run_command``: never a shell, in ``/``); a non-zero exit, a
    timeout or a missing program is a failed step."""
    started = time.monotonic()
    try:
        done = runner(argv, timeout_s=timeout_s)
    except CommandTimeout:
        return StepResult(step, False, f"timed out after {timeout_s:g} s", time.monotonic() - started, tuple(argv))
    except (CommandNotFound, OSError, ValueError) as exc:
        return StepResult(step, False, f"cannot run: {exc}", time.monotonic() - started, tuple(argv))
    tail = (done.stdout + done.stderr).strip()[-OUTPUT_TAIL:]
    detail = f"exit {done.returncode}" + (f": {tail}" if tail else "")
    return StepResult(step, done.returncode == 0, detail, time.monotonic() - started, tuple(argv), done.returncode)


class VllmTarget(Struct, frozen=True):
    base_url: str
    model: str | None
    api_key: str | None = None
    request_timeout_s: float = 10.0
    pid_file: Path | None = None  # [checks.vllm] pid_file: its process's user's listener is believed too


def port_impostor(
    target: VllmTarget,
    proc_root: Path,
    serving_uid: int | None,
    container: Container | None = None,
    run: CommandRunner | None = None,
) -> str | None:
    """Whose listener holds base_url's port when it is not a trusted user's (``vllm_api.port_view``), else None.

    vLLM's port is unprivileged: after a restart that failed to bind it, another user's server there would
    otherwise pass the verification with its own /health, /v1/models and completion. With ``[node] container``,
    the users of the container's processes are trusted too (a user namespace maps its root to another uid)."""
    parts = urlsplit(target.base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    trusted = listener_trust(proc_root, serving_uid, target.pid_file)
    holder = foreign_listener(proc_root, port, parts.hostname, trusted)
    if holder is not None and container is not None and run is not None:
        # asked only when a listener is not already believed: the verification polls this four times a second
        trusted |= {p.uid for p in serving(run, proc_root, container).members if p.uid is not None}
        holder = foreign_listener(proc_root, port, parts.hostname, trusted)
    return holder.describe() if holder is not None else None


class Deadline:
    """``seconds`` from now, by ``clock``."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.start = clock()

    @property
    def left(self) -> float:
        return self.seconds - (self.clock() - self.start)


def verify_vllm(
    target: VllmTarget,
    timeout_s: float,
    client: httpx.Client,
    sleep: Callable[[float], None] = time.sleep,
    impostor: Callable[[], str | None] = lambda: None,
) -> StepResult:
    """``/health`` 200 (polled until the deadline), the model in ``/v1/models``, a chat completion with tokens.

    ``sleep`` waits between polls; the engine's raises when the agent stops, so a stop never waits out the deadline.
    While ``impostor`` says another user holds the port (``port_impostor``), nothing there is asked: its answers
    are not vLLM's."""
    started = time.monotonic()
    deadline = Deadline(timeout_s)
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    base = target.base_url.rstrip("/")
    last = "no answer yet"
    while True:
        taken = impostor()
        try:
            if taken is not None:
                last = taken
            else:
                health = client.get(f"{base}/health", headers=headers, timeout=target.request_timeout_s)
                if health.status_code == 200:
                    break
                last = f"/health answered {health.status_code}"
        except httpx.HTTPError as exc:
            last = f"/health: {type(exc).__name__}"
        if deadline.left <= 0:
            why = f"not healthy within {timeout_s:g} s ({last})"
            return StepResult("verify", False, why, time.monotonic() - started)
        sleep(min(POLL_S, max(deadline.left, 0)))
    try:
        detail = _models_and_completion(client, base, headers, target)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return StepResult("verify", False, f"{type(exc).__name__}: {exc}"[:OUTPUT_TAIL], time.monotonic() - started)
    detail = detail or impostor()  # taken meanwhile: the answers were not vLLM's
    return StepResult("verify", detail is None, detail or "healthy, model listed, completion with tokens",
                      time.monotonic() - started)  # fmt: skip


def _models_and_completion(client: httpx.Client, base: str, headers: dict[str, str], t: VllmTarget) -> str | None:
    """None when both pass, else what failed."""
    models = client.get(f"{base}/v1/models", headers=headers, timeout=t.request_timeout_s)
    models.raise_for_status()
    served = [str(m["id"]) for m in models.json()["data"]]
    if not served or (t.model is not None and t.model not in served):
        return f"/v1/models lists {served}, not {t.model or 'any model'}"
    body = {
        "model": t.model or served[0],
        "messages": [{"role": "user", "content": "Reply with the word OK."}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    done = client.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=max(t.request_timeout_s, 30))
    done.raise_for_status()
    tokens = done.json()["usage"]["completion_tokens"]
    if not isinstance(tokens, int) or tokens < 1:
        return f"the completion returned {tokens!r} tokens"
    return None


def wait_ray(
    dashboard_url: str,
    nodes: int,
    gpus: int,
    timeout_s: float,
    client: httpx.Client,
    sleep: Callable[[float], None] = time.sleep,
) -> StepResult:
    """Poll the dashboard until ``nodes`` are ALIVE holding ``gpus`` GPUs together (``sleep`` as in verify_vllm)."""
    started = time.monotonic()
    deadline = Deadline(timeout_s)
    url = f"{dashboard_url.rstrip('/')}/api/v0/nodes?detail=1"
    last = "no answer yet"
    while True:
        try:
            listing = parse_nodes_detail(client.get(url, timeout=5.0).content)
            alive = [n for n in listing if n.alive]
            have = sum(n.gpus for n in alive)
            if len(alive) >= nodes and have >= gpus:
                return StepResult("wait_ray", True, f"{len(alive)} nodes, {have:g} GPUs", time.monotonic() - started)
            last = f"{len(alive)} of {nodes} nodes, {have:g} of {gpus} GPUs"
        except (httpx.HTTPError, RayApiError) as exc:
            last = f"{type(exc).__name__}: {exc}"[:200]
        if deadline.left <= 0:
            return StepResult("wait_ray", False, f"not ready in {timeout_s:g} s: {last}", time.monotonic() - started)
        sleep(min(POLL_S * 2, max(deadline.left, 0)))


def ask_worker(
    peer: str, step: str, action_id: str, token: str | None, timeout_s: float, client: httpx.Client
) -> StepResult:
    """Ask a worker's agent to run its own ``step`` (it runs its configured argv; nothing else travels)."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    name = f"{step}@{peer}"
    sent_at = round(time.time(), 6)
    body = {"step": step, "id": action_id, "ts": sent_at, "mac": step_mac(token or "", step, action_id, sent_at)}
    try:
        answer = client.post(f"{peer}{STEP_PATH}", json=body, headers=headers, timeout=timeout_s + 10)
        doc = answer.json()
    except (httpx.HTTPError, ValueError) as exc:
        return StepResult(name, False, f"{type(exc).__name__}: {exc}"[:OUTPUT_TAIL], time.monotonic() - started)
    ok = answer.status_code == 200 and isinstance(doc, dict) and doc.get("ok") is True
    detail = str(doc.get("detail") if isinstance(doc, dict) else doc)[:OUTPUT_TAIL]
    return StepResult(name, ok, f"HTTP {answer.status_code}: {detail}", time.monotonic() - started)


# How a drain ended (dgxdoctor_drains_total{outcome}): the requests reached 0, the timeout came first, the engine was
# hung and could not drain (the restart did not wait), vLLM was dead (nothing to drain), vLLM's counters could not
# be read (not waited for).
DRAIN_OUTCOMES = ("drained", "timeout", "hung", "dead", "unreadable")
# Nothing in flight and no token counted for this long: the balancer stopped sending (a busy one sends the next
# request within milliseconds of the last one's end; one that still routes here shows within this).
DRAIN_QUIET_S = 1.0


def drain_vllm(
    target: VllmTarget,
    timeout_s: float,
    balancer_s: float,
    client: httpx.Client,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[StepResult, str]:
    """The node left rotation: wait the balancer's period (it stops sending), then until vLLM's own
    ``num_requests_running + num_requests_waiting`` stays 0 with no token counted for ``DRAIN_QUIET_S``, at most
    ``timeout_s`` in all. (step, outcome).

    One reading of 0 is not enough: a client's next request arrives milliseconds after its last one ends, and a
    balancer that has not yet seen the drain (its check running late) still sends it here, past the SIGTERM."""
    from dgxdoctor.sources.vllm_metrics import parse_vllm_metrics  # the parser loads with the first drain

    started = time.monotonic()
    deadline = Deadline(timeout_s)
    sleep(min(balancer_s, timeout_s))
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    url = f"{target.base_url.rstrip('/')}/metrics"
    quiet: tuple[float | None, ...] | None = None  # the token counters since nothing is in flight
    quiet_since = 0.0
    while True:
        try:
            answer = client.get(url, headers=headers, timeout=target.request_timeout_s)
            answer.raise_for_status()
            m = parse_vllm_metrics(answer.text)
        except (httpx.HTTPError, ValueError) as exc:
            why = f"vLLM's /metrics cannot be read ({type(exc).__name__}): in-flight requests not waited for"
            return StepResult("drain", True, why, time.monotonic() - started), "unreadable"
        left = (m.num_requests_running or 0) + (m.num_requests_waiting or 0)
        took = time.monotonic() - started
        counters = (m.prompt_tokens_total, m.generation_tokens_total, m.requests_finished_total)
        if left > 0 or counters != quiet:
            quiet, quiet_since = (counters if left <= 0 else None), time.monotonic()
        if quiet is not None and time.monotonic() - quiet_since >= DRAIN_QUIET_S:
            return StepResult("drain", True, f"drained: 0 running, 0 waiting after {took:.1f} s", took), "drained"
        if deadline.left <= 0:
            why = (f"drain_timeout_s {timeout_s:g} s reached with {left:g} requests in flight: SIGTERM lets vLLM's "
                   "--shutdown-timeout finish them")  # fmt: skip
            return StepResult("drain", True, why, took), "timeout"
        sleep(min(POLL_S, max(deadline.left, 0)))

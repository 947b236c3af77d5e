"""When the NCCL probe may run: never while vLLM serves on this node, in the daemon only inside a maintenance window.

The probe takes every GPU and the fabric for seconds to minutes; run during serving it would stall requests and
measure nothing meaningful. Two signs of serving, either one refuses: a vLLM process on this node (procfs: it holds
the GPUs), or vLLM's ``/metrics`` reporting running requests. ``force`` overrides both (an operator who knows).

By hand: ``pgrep -af vllm``; ``curl -s localhost:8000/metrics | grep num_requests_running``.
"""

from __future__ import annotations

from datetime import datetime, timezone

from msgspec import Struct

from dgxdoctor.environment import Environment
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.procfs import iter_processes, runs_package, trusted_process
from dgxdoctor.sources.prom_text import PromTextError
from dgxdoctor.sources.vllm_metrics import NotVllmMetrics, parse_vllm_metrics

# "Sat 02:00-04:00", "02:00-04:00" (every day), "Mon-Fri 23:00-01:00" (over midnight); times in UTC.
WINDOW_RE = lazy_compile(
    r"^(?:(?P<d1>Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:-(?P<d2>Mon|Tue|Wed|Thu|Fri|Sat|Sun))? )?"
    r"(?P<h1>[01]\d|2[0-3]):(?P<m1>[0-5]\d)-(?P<h2>[01]\d|2[0-4]):(?P<m2>[0-5]\d)$"
)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class Window(Struct, frozen=True):
    days: frozenset[int]  # 0 = Monday; the day the window starts
    start_min: int
    end_min: int

    def contains(self, when: datetime) -> bool:
        minute = when.hour * 60 + when.minute
        today, yesterday = when.weekday(), (when.weekday() - 1) % 7
        if self.start_min < self.end_min:
            return today in self.days and self.start_min <= minute < self.end_min
        # over midnight: the evening part today, or the morning part of a window that started yesterday
        return (today in self.days and minute >= self.start_min) or (yesterday in self.days and minute < self.end_min)


def parse_window(text: str) -> Window:
    """``[Day[-Day] ]HH:MM-HH:MM`` in UTC; ValueError naming what is wrong."""
    m = WINDOW_RE.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not '[Mon[-Fri] ]HH:MM-HH:MM' (UTC)")
    d1, d2 = m.group("d1"), m.group("d2")
    if d1 is None:
        days = frozenset(range(7))
    else:
        a, b = DAYS.index(d1), DAYS.index(d2 or d1)
        days = frozenset((a + i) % 7 for i in range((b - a) % 7 + 1))
    start = int(m.group("h1")) * 60 + int(m.group("m1"))
    end = int(m.group("h2")) * 60 + int(m.group("m2"))
    if start == end or end > 24 * 60:
        raise ValueError(f"{text!r}: the window is empty or ends after 24:00")
    return Window(days, start, end)


def in_window(windows: list[str], now: float) -> bool:
    when = datetime.fromtimestamp(now, tz=timezone.utc)
    return any(parse_window(w).contains(when) for w in windows)


def vllm_pids(env: Environment) -> list[int]:
    """Processes on this node running vLLM (its API server, engine core or workers), of root, dgxdoctor's user or
    ``[node] serving_user``: another user's ``python -m vllm`` does not hold the serving GPUs, and would otherwise
    refuse every probe."""
    return [
        p.pid
        for p in iter_processes(env.proc_root)
        if p.cmdline and runs_package(p.cmdline, "vllm") and trusted_process(p.uid, None, env.serving_uid)
    ]


def running_requests(env: Environment, url: str, timeout_s: float = 2.0) -> float | None:
    """``vllm:num_requests_running`` from ``url/metrics``; None when nothing answers there (not serving)."""
    import httpx

    try:
        with env.http_client(timeout_s=timeout_s) as client:
            response = client.get(f"{url.rstrip('/')}/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_vllm_metrics(response.text).num_requests_running
    except (NotVllmMetrics, PromTextError):
        return None


def serving_reason(env: Environment, vllm_url: str | None) -> str | None:
    """Why the probe must not run now (vLLM serves here), or None."""
    pids = vllm_pids(env)
    if pids:
        shown = ", ".join(map(str, pids[:5]))
        return f"vLLM is running on this node (pid {shown}) and holds the GPUs"
    if vllm_url:
        running = running_requests(env, vllm_url)
        if running:
            return f"vLLM at {vllm_url} has {running:g} running request(s)"
    return None

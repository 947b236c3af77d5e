"""Replay against deployed agents: false actions and recall of remediation through the real daemons (issue 39).

benchmarks/replay.py runs the real engine and verdicts over hundreds of simulated node-days on a fake clock; this
runs the same kind of life through what an operator deploys, in real time: two nodes of the multi-node harness
(tests/harness: network and PID namespaces, the README's install, each agent started as systemd/dgxdoctor.service
starts it, in act mode), vLLM and Ray from the shipped units with their stand-in programs, the head's checks
reading the worker over real HTTP through the real validation, a real Prometheus evaluating `dgxdoctor rules` and a
real Alertmanager delivering to the head's webhook. The actions run the daemons' own commands: the harness's
``systemctl`` first on each node's PATH records each call (the stand-in actuators: injected commands, nothing
patched), and this program makes the world answer it as systemd would (``restart vllm.service`` stops and starts
the stand-in vLLM, ``start ray-head.service`` brings the Ray cluster back, ``start vllm-worker-mp.service`` the
headless worker), the call returning once that is done, as systemd's does.

Fed with benign life (healthy serving logs of a real vLLM, tests/fixtures/corpus/healthy, written into vLLM's
journal; real kernel log records and look-alikes of faults appended to each node's kernel log; vLLM's engine
moving between idle and busy; the worker's agent restarted; an agent frozen for 2.5 s so Prometheus's scrapes of it
time out; the operator's own restart of vLLM; a clock step of the agents' injected clock, tests/harness/
clock_agent.py) and with the fault catalogue injected one at a time at seeded random times, it prints what
benchmarks/replay.py prints: false automatic actions, recall per class within its promised time, the time from fault
to action, restarts under a fault a restart cannot cure, and PASS/FAIL against the issue's targets.

The guard's times are scaled down so that one fault of every class fits in minutes (``SETTINGS``; the docs quote
them): the decisions are the same functions of the same inputs at every scale (benchmarks/replay.py measures the
shipped defaults over 450 node-days); what this adds is the real path. Needs root, iproute2, util-linux,
systemd-journal-remote, prometheus and prometheus-alertmanager (as tests/integration/test_deployment.py).

    .venv/bin/python benchmarks/replay_deployed.py                  # 3 faults per class, ~13 minutes
    .venv/bin/python benchmarks/replay_deployed.py --faults 1 --json  # about the suite's version (~4 minutes)
    .venv/bin/python benchmarks/replay_deployed.py --only ray --classes api_hung --no-benign  # to look into one
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
sys.path.insert(0, str(TESTS))
import replay_figures as figures  # noqa: E402  (beside this file)

from harness import Cluster, Node, wait_for  # type: ignore[import-not-found]  # noqa: E402
from harness.namespaces import Spawned  # type: ignore[import-not-found]  # noqa: E402
from sysfstree import build_sysfs_tree  # type: ignore[import-not-found]  # noqa: E402

HEAD, WORKER = "dgx-a", "dgx-b"
AGENT = TESTS / "harness" / "clock_agent.py"
INTERVAL_S = 1.0  # every check's interval here
# [remediation] as measured here: the shipped decisions, their times scaled down (the shipped: hold_s 30,
# vllm_start_grace_s 900, cooldowns 300/900/3600, budget 3 per 3600 s, ladder window 3600 s).
SETTINGS: dict[str, Any] = {
    "hold_s": 3.0,
    "vllm_start_grace_s": 2.0,
    "cooldown_s": {"restart_vllm": 3.0, "restart_cluster": 5.0, "page": 5.0},
    "budget": 50,  # out of reach: faults come here far faster than the shipped 3 per hour allow (the breaker's tests
    "budget_window_s": 120.0,  # are tests/unit/test_remediation_guard.py's; benchmarks/replay.py spaces faults 4 h)
    "ladder_window_s": 8.0,
    "ray_ready_timeout_s": 30.0,
    "verify_timeout_s": 30.0,
    "command_timeout_s": 30.0,
    # Which action is taken and when is what the replay judges; the stand-in vLLM serves no requests to drain, and
    # the drain before a restart has its own proof (tests/integration/test_drain_haproxy.py).
    "drain": False,
}
STALL_S = 3.0  # [checks.vllm] stall_s (shipped 15)
VLLM_GRACE_S = 2.0  # [checks.vllm] startup_grace_s (shipped 900)
HEALTH_TIMEOUT_S = 5.0  # [checks.vllm] request_timeout_s, as shipped: a hung /health is seen after it
HARDWARE_S = 5.0  # a hardware fault lasts this long, then a person fixes it ([checks.xid] clear_after_s too)
RESIDUAL_S = 15.0  # after the fix, the person restarts vLLM this much later if remediation has not
UNANSWERED_S = 40.0  # a curable fault nobody cured ends by a person's hand after this (a miss)
GAP_S = (8.5, 11.0)  # between one fault's end and the next fault: beyond the ladder's window and the cooldowns
# The promised time: the check's interval (+ stall_s or the /health timeout) + hold_s + this, the replay's "one minute"
# scaled down; it also absorbs a machine loaded by other jobs, where a check run due every second takes seconds.
MARGIN_S = 20.0
NCCL_TIMEOUT = (FIXTURES / "logs" / "nccl_timeout.log").read_text().splitlines()
HEALTHY_LOG_LINES = [line for path in sorted((FIXTURES / "corpus" / "healthy").iterdir())
                     for line in path.read_text(errors="replace").splitlines() if line.strip()]  # fmt: skip
KERNEL_LINES = [line.split(";", 1)[-1] for name in ("kmsg_records_debian12_vm.txt", "kmsg_records_h200_580.txt",
                "lookalikes.txt") for line in (FIXTURES / "kernel_log" / name).read_text().splitlines()
                if line.strip() and not line.startswith("#") and "Xid" not in line]  # fmt: skip
XID_LINES = {
    79: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.",
    74: "NVRM: Xid (PCI:0000:D8:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14"
    "(0x100000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    48: "NVRM: Xid (PCI:0000:3b:00): 48, pid=2234, name=python3, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 0, subpartition 0.",
}
IB_PORT = "class/infiniband/mlx5_3/ports/1"
# The replay's clock steps (-90 to +120 s against hold_s 30), scaled as hold_s is: the agent's clock is set this far
# off true time (so one step moves it by the difference to the last).
CLOCK_STEPS_S = (-9.0, -3.0, 4.5, 12.0)


@dataclass(frozen=True)
class FaultClass:
    name: str
    expect: str  # the action on the head, or "page"
    curable: bool
    nodes: tuple[str, ...]
    deployment: str
    detect_s: float = 0.0  # what detection takes beyond the check's interval: stall_s, the /health timeout

    @property
    def deadline_s(self) -> float:
        return INTERVAL_S + self.detect_s + SETTINGS["hold_s"] + MARGIN_S


CATALOGUE = (
    FaultClass("vllm_dead", "restart_vllm", True, (HEAD,), "ray"),
    FaultClass("api_hung", "restart_vllm", True, (HEAD,), "ray", HEALTH_TIMEOUT_S),
    FaultClass("engine_stalled", "restart_vllm", True, (HEAD,), "ray", STALL_S),
    FaultClass("ray_node_lost", "restart_cluster", True, (WORKER,), "ray"),
    FaultClass("gpus_missing", "restart_cluster", True, (WORKER,), "ray"),
    FaultClass("nccl_timeout", "restart_cluster", True, (HEAD,), "ray"),
    FaultClass("xid79", "page", False, (HEAD, WORKER), "ray"),
    FaultClass("xid74", "page", False, (HEAD, WORKER), "ray"),
    FaultClass("xid48", "page", False, (HEAD, WORKER), "ray"),
    FaultClass("ib_port_down", "page", False, (HEAD, WORKER), "ray"),
    FaultClass("mp_worker_down", "restart_cluster", True, (WORKER,), "mp"),
)
VLLM_CLASSES = ("vllm_dead", "api_hung", "engine_stalled")  # cured by any restart of vLLM


@dataclass
class Fault:
    cls: FaultClass
    node: str
    start: float = 0.0
    end: float | None = None  # fixed (hardware) or ended by a person (a miss)
    cured_at: float | None = None
    answered_at: float | None = None
    answer: str = ""

    def open(self, now: float) -> bool:
        return self.start <= now and self.cured_at is None and (self.end is None or now < self.end)


@dataclass
class Record:
    actions: list[dict[str, Any]] = field(default_factory=list)
    pages: list[dict[str, Any]] = field(default_factory=list)
    benign: list[tuple[float, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    node_s: float = 0.0
    phases: list[str] = field(default_factory=list)
    alerts: set[str] = field(default_factory=set)  # problems of alerts Alertmanager delivered to a webhook


class World:
    """One deployment (``ray`` or ``mp``) on two namespaced nodes, its faults and benign life, its actuators' answers
    and the agents' audits read as they are written."""

    def __init__(self, cluster: Cluster, deployment: str, rng: random.Random, record: Record,
                 say: Callable[[str], None]) -> None:  # fmt: skip
        self.cluster, self.deployment, self.rng, self.record, self.say = cluster, deployment, rng, record, say
        self.head, self.worker = cluster[HEAD], cluster[WORKER]
        self.nodes = (self.head, self.worker)
        self.lock = threading.RLock()
        self.vllm: Spawned | None = None
        self.headless: Spawned | None = None
        self.engine = self.head.root / "engine"
        self.faults: list[Fault] = []
        self.residual: Fault | None = None  # a fixed hardware fault left vLLM down or its engine stalled
        self.residual_at = 0.0
        self.seen_calls = {n.name: 0 for n in self.nodes}
        for node in self.nodes:  # each systemctl call returns once answered here, as systemd's returns once done
            node.systemctl_answered.write_text("")
        self.seen_audit = {n.name: 0 for n in self.nodes}
        self.stopping = threading.Event()
        self.fixtures = self._ray_fixtures()
        self.vllm_banner = 0

    # -- set up --------------------------------------------------------------------------------------------------

    def _ray_fixtures(self) -> Path:
        """tests/fixtures/ray plus a scenario of the worker node with 4 of its 8 GPUs (Ray's "GPU 8 of 16")."""
        target = self.cluster.root / "ray-fixtures"
        shutil.copytree(FIXTURES / "ray", target)
        doc = json.loads((target / "healthy-nodes-detail.json").read_text())
        for node in doc["data"]["result"]["result"]:
            if not node["is_head_node"]:
                node["resources_total"]["GPU"] = 4.0
        (target / "gpus_missing-nodes-detail.json").write_text(json.dumps(doc))
        for part in ("cluster-status.json", "nodes-summary.json"):
            shutil.copyfile(target / f"healthy-{part}", target / f"gpus_missing-{part}")
        return target

    def configure(self) -> None:
        """Prometheus and Alertmanager first (remediation's pages go to that Alertmanager), then each node's config."""
        monitoring = self.cluster.monitoring
        assert monitoring is not None
        monitoring.start()
        mp = self.deployment == "mp"
        remediation = {"mode": "act", **SETTINGS}
        if mp:
            remediation["commands"] = {"stop_vllm": ["systemctl", "stop", "vllm-head-mp.service"],
                                       "start_vllm": ["systemctl", "start", "vllm-head-mp.service"]}  # fmt: skip
        every = {"interval_s": INTERVAL_S}
        for node in self.nodes:
            sysfs = build_sysfs_tree(node.root / "sys", "dgx_ndr_healthy.txt")
            node.install_nccl_env(NCCL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0", VLLM_HOST_IP=node.ip)
            (node.root / "clock-offset").write_text("0")
            head = node is self.head
            checks = ["xid", "infiniband", "peer_compare", "logs", *(["vllm_executor"] if mp else ["ray"]),
                      *(["vllm"] if head else [])]  # fmt: skip
            extra: dict[str, dict[str, Any]] = {f"checks.{c}": dict(every) for c in checks}
            extra["checks.vllm"] = {**every, "startup_grace_s": VLLM_GRACE_S, "stall_s": STALL_S, "canary": "never"}
            # the XID stops counting a little after the person's fix (HARDWARE_S): the fix comes first
            extra["checks.xid"] = {**every, "clear_after_s": HARDWARE_S + 2}
            extra["paths"] = {"sysfs_root": str(sysfs), "host_root": str(node.root)}
            extra["remediation"] = remediation
            extra["alerts"] = {"alertmanager_url": monitoring.alertmanager_url}
            if not head:
                extra.pop("checks.vllm")
            node.configure(extra=extra, only=checks, node={"executor": "mp"} if mp else None)

    def start(self) -> None:
        c = self.cluster
        if self.deployment == "ray":
            c.start_unit(self.head, "ray-head.service", RAY_STANDIN_FIXTURES=str(self.fixtures))
            c.start_unit(self.worker, "ray-worker.service")
        else:
            self._start_headless()
        self._start_vllm()
        for node in self.nodes:
            start_agent(node)
        prometheus = c.monitoring
        wait_for("both agents scraped", lambda: prometheus.value('sum(up{job="dgxdoctor"})') == 2.0, 60, *self.nodes)
        self.unhealthy: dict[str, str] = {}
        try:
            wait_for("both nodes healthy", self.healthy, 60, *self.nodes)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nunhealthy: {self.unhealthy}") from None

    def healthy(self) -> dict[str, str] | bool:
        """True when no check on either node is CRITICAL or UNKNOWN (else what is: node/check -> summary)."""
        bad = {f"{node.name}/{name}": str(c["summary"]) for node in self.nodes for name, c in node.checks().items()
               if c["status"] not in ("ok", "skipped", "warning")}  # fmt: skip
        self.unhealthy = bad
        return not bad

    # -- the units, as systemd would run them ----------------------------------------------------------------

    def _unit_log(self) -> Path:
        return self.head.root / f"{'vllm-head-mp' if self.deployment == 'mp' else 'vllm'}.service.log"

    def _banners(self) -> int:
        """How many times the vLLM stand-in said it started (its first line, printed once its handlers are set)."""
        with contextlib.suppress(OSError):
            return self._unit_log().read_text(errors="replace").count("vLLM stand-in:")
        return 0

    def _start_vllm(self) -> None:
        self.engine.write_text("idle")
        self.vllm_banner = self._banners() + 1  # lines are printed to it only once it is up (SIGUSR1 would end it)
        unit = "vllm-head-mp.service" if self.deployment == "mp" else "vllm.service"
        site = {"HEAD_ADDR": self.head.ip} if self.deployment == "mp" else {}
        self.vllm = self.cluster.start_unit(self.head, unit, VLLM_STANDIN_ENGINE_FILE=str(self.engine), **site)

    def _stop_vllm(self) -> None:
        if self.vllm is not None:
            _stop(self.vllm)
            self.vllm = None

    def _start_headless(self) -> None:
        """The worker's headless vLLM, returned once it is up (its ranks started, its first line printed): calls are
        answered in order, so the head's vLLM starts after it, as a real mp head serves only once its workers
        joined (the stand-in head would serve alone, and pass the restart's verification too early)."""
        log = self.worker.root / "vllm-worker-mp.service.log"

        def banners() -> int:
            with contextlib.suppress(OSError):
                return log.read_text(errors="replace").count("vLLM stand-in:")
            return 0

        before = banners()
        self.headless = self.cluster.start_unit(self.worker, "vllm-worker-mp.service", HEAD_ADDR=self.head.ip)
        deadline = time.monotonic() + 30
        while banners() <= before and time.monotonic() < deadline:
            time.sleep(0.05)

    def _stop_headless(self) -> None:
        if self.headless is not None:
            _stop(self.headless)
            self.headless = None

    # -- the actuators' answers, the audits --------------------------------------------------------------------

    def follow(self) -> None:
        """A thread: each new systemctl call answered as systemd would, each new audit line judged."""
        while not self.stopping.is_set():
            try:
                self._follow_once()
            except Exception as exc:  # said, and the run goes on: a thread that died would judge nothing more
                self.say(f"{self.deployment}: follow: {type(exc).__name__}: {exc}")
            self.stopping.wait(0.1)

    def _follow_once(self) -> None:
        with self.lock:
            for node in self.nodes:
                calls = node.systemctl_calls()
                for call in calls[self.seen_calls[node.name] :]:
                    self._systemctl(node, call)
                    with node.systemctl_answered.open("a") as answered:
                        answered.write(f"{call}\n")
                self.seen_calls[node.name] = len(calls)
                audit = _audit(node)
                for line in audit[self.seen_audit[node.name] :]:
                    self._audited(node, line)
                self.seen_audit[node.name] = len(audit)
            self._person()

    def _systemctl(self, node: Node, call: str) -> None:
        verb, _, unit = call.partition(" ")
        now = time.monotonic()
        if node is self.head and unit in ("vllm.service", "vllm-head-mp.service"):
            if verb in ("stop", "restart"):
                self._stop_vllm()
            if verb in ("start", "restart"):
                self._start_vllm()
                if self._hardware_open(now):
                    self._stop_vllm()  # vLLM dies again on a GPU off the bus: a restart cannot help
        elif node is self.worker and unit == "vllm-worker-mp.service":
            if verb in ("stop", "restart"):
                self._stop_headless()
            if verb in ("start", "restart"):
                self._start_headless()
        elif node is self.head and unit == "ray-head.service" and verb in ("start", "restart"):
            self.cluster.ray_scenario(self.head, "healthy")

    def _hardware_open(self, now: float) -> bool:
        return any(f.open(now) and not f.cls.curable and f.cls.name.startswith("xid") for f in self.faults)

    def _audited(self, node: Node, line: dict[str, Any]) -> None:
        now = time.monotonic()
        event = line.get("event")
        if event == "decision" and line.get("source") == "alert":
            self.record.alerts.add(f"{node.name}: {line.get('problem')}")
        if event == "action_started":
            self._acted(node, str(line["action"]), str(line.get("problem")), now)
        elif event == "page" or (event == "decision" and line.get("action") == "page"
                                 and line.get("verdict") in ("suggest", "page")):  # fmt: skip
            opened = [f for f in self.faults if f.open(now)]
            if event == "page":
                before = self.record.actions[-1] if self.record.actions else None
                after = f"{now - before['t']:.1f} s after {before['action']} on {before['node']}" if before else ""
                self.record.pages.append({"t": now, "node": node.name, "problem": line.get("problem"), "after": after,
                                          "seen": line.get("seen"), "reason": line.get("reason"),
                                          "faults": [f.cls.name for f in opened]
                                          or ([self.residual.cls.name] if self.residual else [])})  # fmt: skip
            for f in opened:
                if not f.cls.curable and f.answered_at is None:
                    f.answered_at, f.answer = now, f"page ({line.get('problem')})"

    def _acted(self, node: Node, action: str, problem: str, now: float) -> None:
        opened = [f for f in self.faults if f.open(now)]
        curable = [f for f in opened if f.cls.curable]
        incurable = [f for f in opened if not f.cls.curable]
        if incurable:
            verdict = "false: a restart while " + ", ".join(f"{f.cls.name} on {f.node}" for f in incurable)
        elif curable or self.residual is not None:
            verdict = "true"
        else:
            verdict = "false: no fault behind it"
        behind = [f.cls.name for f in opened] or ([self.residual.cls.name] if self.residual else [])
        self.residual = None
        recent = [e for t, e in self.record.benign if 0 <= now - t < 60]
        self.record.actions.append({"t": now, "node": node.name, "action": action, "problem": problem,
                                    "verdict": verdict, "faults": behind, "benign": recent})  # fmt: skip
        whole = action == "restart_cluster" or self.deployment == "mp"
        for f in curable:
            if f.answered_at is None and (whole or action == f.cls.expect):
                f.answered_at, f.answer = now, action
            if whole or f.cls.name in VLLM_CLASSES:
                f.cured_at = now  # the world is cured by the commands themselves (vLLM restarted, Ray started)

    def _person(self) -> None:
        """What a person does: a missed curable fault is ended by hand; after a hardware fix, vLLM restarted."""
        now = time.monotonic()
        for f in self.faults:
            if f.cls.curable and f.cured_at is None and f.end is None and now - f.start >= UNANSWERED_S:
                f.end = now
                self._heal(f)
        if self.residual is not None and now >= self.residual_at:
            self.residual = None
            self._stop_vllm()
            self._start_vllm()

    # -- faults ------------------------------------------------------------------------------------------------

    def inject(self, f: Fault) -> None:
        node = self.head if f.node == HEAD else self.worker
        name = f.cls.name
        with self.lock:
            f.start = time.monotonic()
            self.faults.append(f)
            self.record.faults.append(f)
            if name == "vllm_dead" and self.vllm is not None:
                self.vllm.signal(signal.SIGKILL)
            elif name == "api_hung" and self.vllm is not None:
                self.vllm.signal(signal.SIGSTOP)
            elif name in ("engine_stalled", "ib_port_down"):
                self.engine.write_text("stalled")
            elif name == "ray_node_lost":
                self.cluster.ray_scenario(self.head, "dead")
            elif name == "gpus_missing":
                self.cluster.ray_scenario(self.head, "gpus_missing")
            elif name == "nccl_timeout":
                self._print(NCCL_TIMEOUT)
            elif name.startswith("xid"):
                _append(node.kmsg, [XID_LINES[int(name[3:])]])
                if self.vllm is not None:
                    self.vllm.signal(signal.SIGKILL)  # vLLM dies with its GPU
            elif name == "mp_worker_down":
                self._stop_headless()
            if name == "ib_port_down":
                _port(node, up=False)

    def fix(self, f: Fault) -> None:
        """A hardware fault fixed by a person (the XID clears with [checks.xid] clear_after_s): what it left behind
        (vLLM dead, its engine stalled) stays until remediation restarts vLLM, or the person does."""
        with self.lock:
            f.end = time.monotonic()
            node = self.head if f.node == HEAD else self.worker
            if f.cls.name == "ib_port_down":
                _port(node, up=True)
            elif f.cls.name.startswith("xid"):
                # The GPU reset or the reboot: the kernel log starts over (a plain file here has no sequence numbers
                # an agent restarted later could resume after, as it does on /dev/kmsg).
                kept = [line for line in node.kmsg.read_text().splitlines() if "Xid" not in line]
                node.kmsg.write_text("".join(f"{line}\n" for line in kept))
            self.residual, self.residual_at = f, f.end + RESIDUAL_S

    def _heal(self, f: Fault) -> None:
        name = f.cls.name
        if name in ("ray_node_lost", "gpus_missing"):
            self.cluster.ray_scenario(self.head, "healthy")
        elif name == "mp_worker_down":
            self._start_headless()
        if name in (*VLLM_CLASSES, "mp_worker_down"):
            self._stop_vllm()
            self._start_vllm()

    def settled(self, f: Fault) -> bool:
        """The fault is over (cured, fixed and its residue gone, or ended by hand) and no action is in flight."""
        with self.lock:
            over = f.cured_at is not None or (f.end is not None and (f.cls.curable or self.residual is None))
            return over and not self._in_flight()

    def _in_flight(self) -> bool:
        for node in self.nodes:
            doc = node.state / "remediation-state.json"
            with contextlib.suppress(OSError, ValueError):
                if json.loads(doc.read_text()).get("in_flight"):
                    return True
        return False

    # -- benign life -------------------------------------------------------------------------------------------

    def benign(self, event: str) -> None:
        with self.lock:
            self.record.benign.append((time.monotonic(), event))
        if event not in ("busy", "idle"):
            self.say(f"{self.deployment}: benign: {event}")
        if event == "agent_restart":
            self.worker.stop_daemon()
            time.sleep(self.rng.uniform(1, 4))
            start_agent(self.worker)
        elif event == "scrape_timeout":
            node = self.rng.choice(self.nodes)
            assert node.daemon is not None
            node.daemon.signal(signal.SIGSTOP, group=False)
            time.sleep(2.5)  # Prometheus's scrape_timeout is 1 s: its scrapes of this agent time out meanwhile
            node.daemon.signal(signal.SIGCONT, group=False)
            os.kill(node.daemon.outer.pid, signal.SIGCONT)  # the nsenter waiting for it stopped with it
        elif event == "planned_restart":
            with self.lock:
                self._stop_vllm()
                time.sleep(self.rng.uniform(0.2, 1.0))
                self._start_vllm()
        elif event == "clock_step":
            node = self.rng.choice(self.nodes)
            offset = self.rng.choice(CLOCK_STEPS_S)
            (node.root / "clock-offset").write_text(str(offset))
            self.say(f"{self.deployment}:   {node.name}'s clock now {offset:+g} s off")
        elif event == "busy":
            with self.lock:
                if self.engine.read_text().strip() == "idle":
                    self.engine.write_text("busy")
        elif event == "idle":
            with self.lock:
                if self.engine.read_text().strip() == "busy":
                    self.engine.write_text("idle")

    def logs(self) -> None:
        """A thread: healthy serving lines into vLLM's journal and kernel records into each node's kernel log."""
        cursor = self.rng.randrange(len(HEALTHY_LOG_LINES))
        while not self.stopping.wait(self.rng.uniform(1.0, 3.0)):
            n = self.rng.randint(0, 20)
            lines = [HEALTHY_LOG_LINES[(cursor + i) % len(HEALTHY_LOG_LINES)] for i in range(n)]
            cursor += n
            with self.lock:
                self._print(lines)
                for node in self.nodes:
                    if self.rng.random() < 0.3:
                        _append(node.kmsg, [self.rng.choice(KERNEL_LINES)])

    def _print(self, lines: Sequence[str]) -> None:
        """Lines printed by vLLM's processes, so into its unit's journal (Cluster.say without its wait)."""
        vllm = self.vllm
        if vllm is None or not vllm.alive() or not lines or self._banners() < self.vllm_banner:
            return
        unit = "vllm-head-mp.service" if self.deployment == "mp" else "vllm.service"
        (self.head.root / f"{unit}.say").write_text("".join(f"{line}\n" for line in lines))
        vllm.signal(signal.SIGUSR1, group=False)


def start_agent(node: Node) -> None:
    """The unit's daemon with its clock injected (tests/harness/clock_agent.py), its offset in ROOT/clock-offset."""
    env = {"PYTHONPATH": f"{TESTS}:{REPO / 'src'}", "DGXDOCTOR_CLOCK_OFFSET_FILE": str(node.root / "clock-offset")}
    node.start_daemon(program=[sys.executable, str(AGENT)], env=env)


def _stop(unit: Spawned) -> None:
    """systemd's stop of a unit's process (SIGCONT, SIGTERM, SIGKILL after 5 s); the ``nsenter`` that waits for it
    stopped with it when it was stopped (SIGSTOP), so it is continued too."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(unit.outer.pid, signal.SIGCONT)
    unit.stop(5)


def _audit(node: Node) -> list[dict[str, Any]]:
    path = node.state / "remediation.jsonl"
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _append(path: Path, lines: Sequence[str]) -> None:
    with path.open("a") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _port(node: Node, up: bool) -> None:
    port = node.root / "sys" / IB_PORT
    (port / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
    (port / "phys_state").write_text("5: LinkUp\n" if up else "2: Polling\n")


# ---- a run ---------------------------------------------------------------------------------------------------


BENIGN = ("agent_restart", "scrape_timeout", "planned_restart", "clock_step", "busy", "idle")


def run_phase(deployment: str, faults_per_class: int, rng: random.Random, record: Record,
              say: Callable[[str], None], only: Sequence[str] = (), benign: bool = True,
              extra_benign: bool = True) -> None:  # fmt: skip
    classes = [c for c in CATALOGUE if c.deployment == deployment and (not only or c.name in only)]
    order = [c for c in classes for _ in range(faults_per_class)]
    rng.shuffle(order)
    with Cluster({HEAD: "head", WORKER: "worker"}, monitor=True) as cluster:
        world = World(cluster, deployment, rng, record, say)
        world.configure()
        world.start()
        say(f"{deployment}: both agents up and healthy; {len(order)} faults to inject")
        threads = [threading.Thread(target=t, daemon=True) for t in (world.follow, world.logs)]
        for t in threads:
            t.start()
        started = time.monotonic()
        # Benign life: every kind at least once per deployment, more at random, spread over the gaps before the
        # faults at random moments of each (the operator's restart of the head's vLLM alone: Ray's deployment only).
        kinds = [k for k in BENIGN if deployment == "ray" or k != "planned_restart"]
        plan = [*kinds, *(rng.choice(kinds) for _ in order if extra_benign)] if benign else []
        rng.shuffle(plan)
        try:
            for i, cls in enumerate(order):
                gap = rng.uniform(*GAP_S)
                events = sorted((rng.uniform(0, gap - 4), e) for e in plan[i :: len(order)])
                t0 = time.monotonic()
                for at, event in events:
                    time.sleep(max(0.0, t0 + at - time.monotonic()))
                    world.benign(event)
                if rng.random() < 0.5:
                    world.benign("idle")
                time.sleep(max(0.0, t0 + gap - time.monotonic()))
                fault = Fault(cls, rng.choice(cls.nodes))
                say(f"{deployment}: fault {i + 1}/{len(order)}: {cls.name} on {fault.node}")
                world.inject(fault)
                if not cls.curable:
                    time.sleep(HARDWARE_S)
                    world.fix(fault)
                wait_for(f"{cls.name} over", lambda f=fault: world.settled(f), UNANSWERED_S + RESIDUAL_S + 30,
                         *world.nodes)  # fmt: skip
                took = "-" if fault.answered_at is None else f"{fault.answered_at - fault.start:.1f} s"
                say(f"{deployment}:   answered {fault.answer or 'never'} after {took}")
            time.sleep(GAP_S[0])  # the last fault's aftermath: a late false action still counts
        finally:
            world.stopping.set()
            for t in threads:
                t.join(10)
            record.node_s += 2 * (time.monotonic() - started)
            record.phases.append(deployment)


@dataclass
class Figures:
    record: Record
    wall_s: float

    @property
    def node_days(self) -> float:
        return self.record.node_s / 86_400

    @property
    def false_actions(self) -> list[dict[str, Any]]:
        return [a for a in self.record.actions if a["verdict"] != "true"]

    def per_class(self) -> dict[str, dict[str, Any]]:
        return figures.per_class(CATALOGUE, self.record.faults, self.record.actions, _missed)

    def stray_pages(self) -> list[dict[str, Any]]:
        return [p for p in self.record.pages if not p["faults"]]

    def verdicts(self) -> dict[str, bool]:
        return figures.verdicts(self.per_class(), len(self.false_actions), self.node_days)


def _missed(f: Fault) -> str:
    after = f" after {f.answered_at - f.start:.1f} s" if f.answered_at else ""
    return f"{f.node}: {f.answer or 'nothing'}{after}"


def replay(
    faults_per_class: int,
    seed: int,
    deployments: Sequence[str] = ("ray", "mp"),
    say: Callable[[str], None] = lambda _: None,
    only: Sequence[str] = (),
    benign: bool = True,
    extra_benign: bool = True,
) -> Figures:
    """``faults_per_class`` faults of each class (of ``only``, else all) in each deployment, with benign life: every
    kind of benign event once per deployment, and (``extra_benign``) one more at random per fault."""
    rng = random.Random(seed)
    record = Record()
    t0 = time.monotonic()
    for deployment in deployments:
        if any(c.deployment == deployment and (not only or c.name in only) for c in CATALOGUE):
            run_phase(deployment, faults_per_class, rng, record, say, only, benign, extra_benign)
    return Figures(record, time.monotonic() - t0)


def report(fig: Figures) -> str:
    r = fig.record
    hours = r.node_s / 3600
    lines = [
        f"deployed: {hours:.2f} node-hours (2 nodes; {', '.join(r.phases)}) in {fig.wall_s:.0f} s; "
        f"{len(r.faults)} faults injected, {len(r.benign)} benign events; settings: {SETTINGS}, [checks.*] "
        f"interval_s {INTERVAL_S:g}, [checks.vllm] stall_s {STALL_S:g}, startup_grace_s {VLLM_GRACE_S:g}",
        f"automatic actions: {len(r.actions)}, false: {len(fig.false_actions)}",
    ]
    for a in fig.false_actions:
        lines.append(f"  FALSE {a['action']} on {a['node']} ({a['problem']}): {a['verdict']}; benign within 60 s: "
                     f"{a['benign'] or 'none'}")  # fmt: skip
    lines += figures.class_table(fig.per_class(), digits=1)
    stray = fig.stray_pages()
    lines.append(f"pages sent: {len(r.pages)}, {len(stray)} with no fault open; alerts delivered to a webhook and "
                 f"decided on: {', '.join(sorted(r.alerts)) or 'none'}")  # fmt: skip
    for p in stray[:5]:
        lines.append(
            f"  page on {p['node']}: {p['problem']} ({p['seen']}; {p['after'] or 'no action before'}): {p['reason']}"
        )
    lines += figures.verdict_lines(fig.verdicts())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--faults", type=int, default=3, help="faults injected per class")
    p.add_argument("--seed", type=int, default=39)
    p.add_argument("--only", choices=("ray", "mp"), help="one deployment only")
    p.add_argument("--classes", default="", help="comma-separated fault classes (default: all)")
    p.add_argument("--no-benign", action="store_true", help="faults only (to look into one)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    only = [c for c in args.classes.split(",") if c]
    fig = replay(
        args.faults,
        args.seed,
        (args.only,) if args.only else ("ray", "mp"),
        say=lambda line: print(line, file=sys.stderr, flush=True),
        only=only,
        benign=not args.no_benign,
    )
    if args.json:
        doc = {"node_hours": fig.record.node_s / 3600, "false_actions": fig.false_actions,
               "per_class": fig.per_class(), "stray_pages": fig.stray_pages(), "verdicts": fig.verdicts(),
               "wall_s": fig.wall_s, "settings": SETTINGS}  # fmt: skip
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(report(fig))
    return 0 if all(fig.verdicts().values()) else 1


if __name__ == "__main__":
    os.nice(10)
    sys.exit(main())

"""`nccl`: an all-reduce bandwidth probe, the tutorial's step 4 ("verify cross-node communication with nccl-tests
before starting the model"), judged against the bandwidth this fabric should give and the transport NCCL used.

By hand: ``NCCL_DEBUG=INFO ./all_reduce_perf -b 8M -e 8G -f 2 -g 8`` (both nodes at once, under mpirun for the
cross-node figure); success is an "Avg bus bandwidth" line, large-message busbw at 70 % or more of the NICs'
nominal rate, ``via NET/IB`` between the nodes and no NCCL WARN.

The probe takes GPUs and fabric bandwidth, so the check is off by default and refuses while vLLM serves on this
node (``checks.nccl_guard``; ``force`` overrides). Run it with ``dgxdoctor check --only nccl`` before and after a
change; the daemon runs it only inside ``maintenance_windows``. It runs ``command`` when set (an nccl-tests binary
or an mpirun line around it); otherwise the bundled torch.distributed probe (``dgxdoctor/probes/allreduce.py``)
with the serving environment's Python. Either way it runs with the node's NCCL env file, ``NCCL_ALGO`` and
``NCCL_PROTO`` pinned (so figures compare over time) and ``NCCL_DEBUG=INFO``, so the transport is read from NCCL's
own lines. With ``peer`` set, the run spans this node and the peer: the peer's agent is asked over the
authenticated API to start its ranks (``checks.nccl_cross``). With ``rails``, one run per HCA names a slow rail.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta, field
from msgspec.structs import replace

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.checks.nccl_cross import PeerRefused, run_cross_node
from dgxdoctor.checks.nccl_guard import in_window, parse_window, serving_reason
from dgxdoctor.checks.nccl_run import DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, ProbeSize
from dgxdoctor.checks.nccl_run import EX_PEER_MISSING as EX_PEER_MISSING  # re-exported: daemon and tests
from dgxdoctor.checks.nccl_run import ProbeRun as ProbeRun
from dgxdoctor.environment import Environment
from dgxdoctor.judge.nccl import (
    DEFAULT_MIN_FRACTION,
    bandwidth_finding,
    nccl_tests_findings,
    peer_probe_failed,
    probe_failed,
)
from dgxdoctor.judge.nccl_transport import describe, spans_nodes, transport_findings
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout, python_argv
from dgxdoctor.sources.nccl_env import read_env_file
from dgxdoctor.sources.nccl_info import NcclTransport, parse_nccl_info
from dgxdoctor.sources.nccl_tests import NcclTestsReport, parse_nccl_tests
from dgxdoctor.sources.serving_env import find_serving_python
from dgxdoctor.sources.statefile import atomic_write, write_failed
from dgxdoctor.sources.sysfs_ib import ports_by_device
from dgxdoctor.validation import Host, OptionalHttpUrl, PeerUrl, sizes_in_order

# The probe's exit statuses, repeated from ``dgxdoctor.probes.allreduce`` so the daemon does not import the probe
# (argparse and all) to compare numbers; a test holds them equal.
EX_NOT_RUNNABLE = 3
# The probe's progress lines on stderr: "# progress 3/14 4194304 B busbw 122.88 GB/s".
PROGRESS = "# progress "
# ``env`` exits 127 when the program it should run does not exist.
EX_ENV_NOT_FOUND = 127

BUSBW = MetricSpec(
    "dgxdoctor_nccl_busbw_bytes_per_second",
    "All-reduce bus bandwidth at the largest message size of the last probe (nccl-tests' busbw).",
)
AVG_BUSBW = MetricSpec(
    "dgxdoctor_nccl_avg_busbw_bytes_per_second",
    "All-reduce bus bandwidth averaged over the probe's message sizes (nccl-tests' 'Avg bus bandwidth').",
)
PROBE_OK = MetricSpec("dgxdoctor_nccl_probe_success", "1 when the last bandwidth probe ran and printed its table.")
RAIL_BUSBW = MetricSpec(
    "dgxdoctor_nccl_rail_busbw_bytes_per_second",
    "All-reduce bus bandwidth at the largest size of the last per-rail probe, NCCL_IB_HCA set to this one HCA.",
    labels=("device", "port"),
)
EXPECTED_BUSBW = MetricSpec(
    "dgxdoctor_nccl_expected_busbw_bytes_per_second",
    "The bus bandwidth this fabric should give at the largest message ([checks.nccl] expected_busbw_gbps); "
    "absent when not configured.",
)

GB = 1e9
# NCCL_ALGO / NCCL_PROTO values: names, lists, exclusions ("^NVLS") and per-collective forms ("allreduce:ring").
NCCL_CHOICE_RE = lazy_compile(r"^[A-Za-z0-9,^:;_]{0,128}\Z")
HCA_RE = lazy_compile(r"^[A-Za-z0-9_.-]{1,64}(?::\d{1,3})?\Z")


class NcclSettings(CheckSettings, frozen=True):
    """The NCCL all-reduce bandwidth probe (off by default: it uses the GPUs and the fabric)."""

    enabled: Annotated[bool, Meta(description="run this check (it occupies the GPUs while it runs)")] = False
    interval_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="daemon: seconds between attempts (runs only in a window)")
    ] = 3600.0
    timeout_s: Annotated[float, Meta(gt=0, le=DAY_S, description="a probe that takes longer is UNKNOWN")] = 600.0
    command: Annotated[
        list[str],
        Meta(
            description='argv of the probe, e.g. ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8M", "-e", '
            '"8G", "-f", "2", "-g", "8"]; empty: the bundled torch.distributed probe'
        ),
    ] = field(default_factory=list)
    serving_python: Annotated[
        str | None,
        Meta(description="Python with torch for the bundled probe; default: that of a running vLLM or Ray process"),
    ] = None
    gpus: Annotated[int, Meta(ge=0, le=64, description="bundled probe: GPUs to use on this node (0 = all visible)")] = 0
    backend: Annotated[
        Literal["nccl", "gloo"],
        Meta(description="bundled probe: torch.distributed backend; gloo runs on CPU (no NCCL: tests, rehearsals)"),
    ] = "nccl"
    min_bytes: Annotated[ProbeSize, Meta(description="bundled probe: smallest message (8M, 1G, 512K)")] = (
        DEFAULT_MIN_BYTES
    )
    max_bytes: Annotated[ProbeSize, Meta(description="bundled probe: largest message")] = DEFAULT_MAX_BYTES
    quick: Annotated[bool, Meta(description="bundled probe: 32M-128M, few iterations: an answer within 10 s")] = False
    algo: Annotated[str, Meta(description="NCCL_ALGO for the probe, pinned so runs compare; empty: NCCL chooses")] = (
        "Ring"
    )
    proto: Annotated[str, Meta(description="NCCL_PROTO for the probe, pinned likewise; empty: NCCL chooses")] = "Simple"
    env_file: Annotated[
        Path | None,
        Meta(description="the node's NCCL env file (read as data): the probe runs with exactly what vLLM gets"),
    ] = Path("/etc/profile.d/nccl.sh")
    force: Annotated[
        bool,
        Meta(
            description="run even while vLLM serves on this node (disturbs serving); "
            "this node's own setting: a peer's join request never carries it"
        ),
    ] = False
    vllm_url: Annotated[
        OptionalHttpUrl, Meta(description="vLLM whose running requests make the probe refuse; empty: none")
    ] = OptionalHttpUrl("http://127.0.0.1:8000")
    maintenance_windows: Annotated[
        list[str],
        Meta(
            description='daemon: run only inside these UTC windows, e.g. ["Sat 02:00-04:00"]; none: the daemon never '
            "runs the probe, `dgxdoctor check --only nccl` runs it on demand"
        ),
    ] = field(default_factory=list)
    peer: Annotated[
        PeerUrl | None,
        Meta(description="cross-node: the peer's dgxdoctor URL (http://dgx-b:9835); it is asked to join over its API"),
    ] = None
    master_addr: Annotated[
        Host | None, Meta(description="cross-node: this node's address the peer's ranks reach for the rendezvous")
    ] = None
    master_port: Annotated[int, Meta(ge=1, le=65535, description="cross-node: rendezvous port on this node")] = 29555
    join_timeout_s: Annotated[
        float, Meta(gt=0, le=600, description="cross-node: a peer not joined by then is UNKNOWN")
    ] = 60.0
    rails: Annotated[
        list[str],
        Meta(
            description='per-rail runs: one probe per HCA with NCCL_IB_HCA set to it alone, e.g. ["mlx5_0", "mlx5_1"]'
        ),
    ] = field(default_factory=list)
    rail_min_fraction: Annotated[
        float, Meta(gt=0, le=1, description="a rail below this fraction of the median rail is named as degraded")
    ] = 0.8
    expected_busbw_gbps: Annotated[
        Annotated[float, Meta(gt=0, le=100000)] | None,
        Meta(
            description="bus bandwidth this fabric should give at the largest message, GB/s (e.g. 8 x 400 Gb/s NICs: "
            "400); unset: only the TCP-fallback floor is judged"
        ),
    ] = None
    min_fraction: Annotated[
        float,
        Meta(gt=0, le=1, description="busbw below this fraction of expected_busbw_gbps is critical (the tutorial)"),
    ] = DEFAULT_MIN_FRACTION

    def __post_init__(self) -> None:
        sizes_in_order(self.min_bytes, self.max_bytes)
        for name in ("algo", "proto"):
            value = getattr(self, name)
            if not NCCL_CHOICE_RE.match(value):
                raise ValueError(f"{name}: {value!r} is not an NCCL_ALGO/NCCL_PROTO value (e.g. Ring, Simple, ^NVLS)")
        bad = [r for r in self.rails if not HCA_RE.match(r)]
        if bad:
            raise ValueError(f"rails: not HCA names (mlx5_0 or mlx5_0:1): {bad}")
        for window in self.maintenance_windows:
            try:
                parse_window(window)
            except ValueError as exc:
                raise ValueError(f"maintenance_windows: {exc}") from None


class NcclCheck(Check[NcclSettings]):
    name: ClassVar[str] = "nccl"
    probes: ClassVar[tuple[str, ...]] = ("probe",)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self._progress: Callable[[str], None] | None = None

    def attach_progress(self, sink: Callable[[str], None]) -> None:
        """Where a running probe's progress lines go (``dgxdoctor check`` prints them on stderr)."""
        self._progress = sink

    @property
    def token(self) -> str | None:
        """The shared secret a peer's agent wants (``env.token``, the seam every check gets)."""
        return self.env.token()

    # -- what runs -------------------------------------------------------------------------------------

    def nccl_env(self, rail: str | None = None) -> dict[str, str]:
        """The probe's environment: the node's NCCL env file, then the pinned choices and INFO logging."""
        return probe_env(self.settings, rail, self.env.host_root)

    def argv(self, rail: str | None = None, *, nnodes: int = 1, node_rank: int = 0) -> list[str] | None:
        """``env NAME=VALUE ... PROGRAM ARGS``: argv only, never a shell; None when there is no probe here."""
        program = self.program(nnodes=nnodes, node_rank=node_rank)
        if program is None:
            return None
        return ["env", *(f"{k}={v}" for k, v in self.nccl_env(rail).items()), *program]

    def program(self, *, nnodes: int = 1, node_rank: int = 0) -> list[str] | None:
        cfg = self.settings
        if cfg.command:
            return list(cfg.command)
        python = cfg.serving_python
        if python is None:
            found = find_serving_python(self.env.proc_root)
            python = found.exe if found else None
        if python is None:
            return None
        from dgxdoctor.probes import allreduce  # argparse and the probe's code: only once there is a probe to run

        argv = python_argv(python, str(Path(allreduce.__file__)))
        if cfg.quick:
            argv += ["--quick"]
        else:
            argv += ["--min-bytes", cfg.min_bytes, "--max-bytes", cfg.max_bytes]
        if cfg.gpus:
            argv += ["--gpus", str(cfg.gpus)]
        if cfg.backend != "nccl":
            argv += ["--backend", cfg.backend]
        if nnodes > 1:
            argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-port", str(cfg.master_port)]
            argv += ["--master-addr", cfg.master_addr or "127.0.0.1", "--join-timeout", f"{cfg.join_timeout_s:g}"]
        return argv

    def refusal(self) -> str | None:
        """Why the probe must not run now, or None."""
        cfg = self.settings
        if not self.env.one_shot and not in_window(cfg.maintenance_windows, self.env.clock()):
            if not cfg.maintenance_windows:
                return "no maintenance window configured: the daemon never probes; run `dgxdoctor check --only nccl`"
            return f"outside the maintenance windows {cfg.maintenance_windows} (UTC)"
        if cfg.force:
            return None
        why = serving_reason(self.env, cfg.vllm_url or None)
        return None if why is None else f"refused: {why} (set checks.nccl.force to probe anyway)"

    def join_request(self, run_id: str, rail: str | None) -> dict[str, Any]:
        """What the peer's agent is asked to run (``POST /nccl/join``, validated there by daemon/nccl_join.py)."""
        cfg = self.settings
        return {
            "run_id": run_id,
            "master_addr": cfg.master_addr or "127.0.0.1",
            "master_port": cfg.master_port,
            "nnodes": 2,
            "node_rank": 1,
            "join_timeout_s": cfg.join_timeout_s,
            "quick": cfg.quick,
            "min_bytes": cfg.min_bytes,
            "max_bytes": cfg.max_bytes,
            "algo": cfg.algo,
            "proto": cfg.proto,
            "rail": rail,
        }

    # -- running ---------------------------------------------------------------------------------------

    def run(self) -> CheckResult:
        refused = self.refusal()
        if refused is not None:
            return CheckResult.skipped(self.name, refused)
        if self.argv() is None:
            return CheckResult.skipped(
                self.name, "no probe: set checks.nccl.command (nccl-tests) or checks.nccl.serving_python (torch)"
            )
        runs: list[ProbeRun] = []
        rails: list[str | None] = [*self.settings.rails] or [None]
        for rail in rails:
            try:
                runs.append(self.run_once(rail))
            except PeerRefused as exc:
                return CheckResult.skipped(self.name, f"the peer refused: {exc}")
            except CommandNotFound as exc:
                return CheckResult.skipped(self.name, str(exc))
            except CommandTimeout as exc:
                return replace(CheckResult.unknown(self.name, f"the NCCL probe timed out: {exc}"), timeouts=("probe",))
        if not self.settings.command and runs[0].returncode == EX_NOT_RUNNABLE:
            return CheckResult.skipped(self.name, runs[0].stderr.strip().lstrip("# ") or "probe cannot run here")
        return judge_runs(runs, self.settings, node_has_ib=bool(ports_by_device(self.env.sysfs_root, counters=False)))

    def run_once(self, rail: str | None) -> ProbeRun:
        if self.settings.peer:
            argv = self.argv(rail, nnodes=2, node_rank=0)
            return run_cross_node(
                self.env, self.settings.peer, self.token, lambda run_id: self.join_request(run_id, rail),
                lambda: self.run_local(argv, rail), rail,
            )  # fmt: skip
        return self.run_local(self.argv(rail), rail)

    def run_local(self, argv: list[str] | None, rail: str | None, timeout_s: float | None = None) -> ProbeRun:
        if argv is None:
            raise CommandNotFound("no probe program")
        program = argv[argv.index("env") + 1 + len(self.nccl_env(rail))] if argv[0] == "env" else argv[0]
        if shutil.which(program) is None:
            raise CommandNotFound(f"{program} not found")
        # Leave room for the runner's own timeout to report a hang rather than a half-read table.
        timeout = timeout_s if timeout_s is not None else max(1.0, self.settings.timeout_s - 5)
        if self._progress is None:
            done = self.env.run_command(argv, timeout_s=timeout)
        else:
            sink = self._progress
            label = f"nccl{f' {rail}' if rail else ''}:"
            done = self.env.run_command_lines(
                argv, timeout, lambda line: sink(f"{label} {line.lstrip('# ')}") if PROGRESS in line else None
            )
        self.keep_output(rail, done.stdout, done.stderr)
        return ProbeRun(done.returncode, done.stdout, done.stderr, rail)

    def keep_output(self, rail: str | None, stdout: str, stderr: str) -> None:
        """The whole output of the last run (table and NCCL's INFO lines) in ``<state_dir>/nccl/``, for the
        operator: ``last-probe.txt``, or ``last-probe-<HCA>.txt`` for a per-rail run."""
        path = self.env.state_dir / "nccl" / (f"last-probe-{rail}.txt" if rail else "last-probe.txt")
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            atomic_write(path, f"{stdout}\n# --- stderr ---\n{stderr}".encode(), 0o640)  # never through a link
        except OSError as exc:
            write_failed(path.name, path, exc)  # logged and counted; the verdict does not depend on it


def probe_env(cfg: NcclSettings, rail: str | None = None, host_root: Path = Path("/")) -> dict[str, str]:
    """The node's NCCL env file (NCCL_*, GLOO_*, TORCH_NCCL_*, VLLM_HOST_IP), the pinned algorithm and protocol,
    INFO logging for the transport lines, and for a per-rail run ``NCCL_IB_HCA`` set to that HCA alone."""
    env: dict[str, str] = {}
    if cfg.env_file is not None and cfg.env_file.is_file():
        values = read_env_file(cfg.env_file, host_root).values
        env.update({k: v for k, v in values.items() if k.startswith(("NCCL_", "GLOO_", "TORCH_NCCL_", "VLLM_"))})
    if cfg.algo:
        env["NCCL_ALGO"] = cfg.algo
    if cfg.proto:
        env["NCCL_PROTO"] = cfg.proto
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = "INIT,NET,ENV"
    env.pop("NCCL_DEBUG_FILE", None)  # the lines must reach the probe's stdout
    if rail is not None:
        env["NCCL_IB_HCA"] = f"={rail}"  # "=": exactly this HCA, not every name starting with it
    return env


def _report(run: ProbeRun) -> NcclTestsReport | None:
    try:
        return parse_nccl_tests(run.stdout)
    except ValueError:
        return None


def judge(stdout: str, stderr: str, returncode: int, cfg: NcclSettings, node_has_ib: bool = False) -> CheckResult:
    """Pure: the verdict on one probe's output."""
    return judge_runs([ProbeRun(returncode, stdout, stderr)], cfg, node_has_ib=node_has_ib)


def judge_runs(runs: list[ProbeRun], cfg: NcclSettings, *, node_has_ib: bool) -> CheckResult:
    """Pure: the verdict on one or more probe runs (one per rail), each possibly with the peer's side."""
    b = ResultBuilder(NcclCheck.name)
    rail_busbw: dict[str, float] = {}
    summaries: list[str] = []
    for run in runs:
        summary, peak = _judge_one(b, run, cfg, node_has_ib)
        summaries.append(summary)
        if run.rail is not None and peak is not None:
            rail_busbw[run.rail] = peak
            device, _, port = run.rail.partition(":")
            b.sample(RAIL_BUSBW, peak * GB, device=device, port=port or "1")
    if runs and runs[0].rail is None:
        return b.build(summaries[0])
    from dgxdoctor.judge.nccl_rails import rail_findings

    b.add(*rail_findings(rail_busbw, [r.rail for r in runs if r.rail], cfg.rail_min_fraction))
    shown = ", ".join(f"{rail} {bw:.1f}" for rail, bw in rail_busbw.items())
    return b.build(f"per-rail busbw (GB/s): {shown or 'none measured'}")


def _judge_one(b: ResultBuilder, run: ProbeRun, cfg: NcclSettings, node_has_ib: bool) -> tuple[str, float | None]:
    subject = run.rail
    prefix = f"{run.rail}: " if run.rail else ""
    # NCCL's INFO lines are read for the transport below; the failure catalog reads the rest (WARN lines, errors):
    # an INFO line such as "NET/IB : No device found" is expected on a node without IB.
    # A peer that never joined leaves only the probe's own wait for it (a rendezvous timeout): that is the finding
    # below, with the output as its evidence, not a second fault read from the catalog.
    text = "\n".join(line for line in (run.stdout + "\n" + run.stderr).splitlines() if "NCCL INFO" not in line)
    from dgxdoctor.judge.scan import scan_text  # with the probe's output: an idle daemon never holds it
    from dgxdoctor.judge.signatures import load_catalog

    for match in scan_text(load_catalog(), text) if run.returncode != EX_PEER_MISSING else ():
        b.add(match.signature.finding(subject, match.line.strip()[:500]))
    if run.returncode == EX_PEER_MISSING:
        b.add(
            Finding(
                "NCCL_PEER_NOT_JOINED",
                Status.UNKNOWN,
                f"the peer did not join the probe within {cfg.join_timeout_s:g} s",
                subject or cfg.peer,
                evidence=(run.peer_error or run.stderr.strip())[-400:] or None,
                remedy="check the peer's dgxdoctor (journalctl -u dgxdoctor), that it reaches "
                f"{cfg.master_addr}:{cfg.master_port}, and that its serving Python has torch",
            )
        )
        return f"{prefix}the peer did not join within {cfg.join_timeout_s:g} s", None
    report = _report(run)
    if run.returncode != 0 or report is None or not report.rows:
        tail = (run.stderr.strip() or run.stdout.strip())[-400:]
        b.sample(PROBE_OK, 0)
        b.add(probe_failed(run.returncode, subject, tail))
        return f"{prefix}probe failed (exit {run.returncode})", None
    b.sample(PROBE_OK, 1)
    transport = parse_nccl_info(run.stdout + "\n" + run.stderr)  # stderr too: the table's own parse reads stdout
    cross = run.peer is not None or spans_nodes(transport, report.hosts) is True
    b.add(*nccl_tests_findings(report, tcp_floor=cfg.backend == "nccl"))
    if cfg.backend == "nccl" or transport.seen:
        b.add(*transport_findings(transport, node_has_ib=node_has_ib, subject=subject, cross_node=cross))
    peak = _bandwidth(b, report, cfg, subject, sample=run.rail is None)
    if run.peer is not None:
        b.add(*_peer_findings(run, report, cfg))
    avg = "n/a" if report.avg_busbw_gbps is None else f"{report.avg_busbw_gbps:.1f}"
    shown = "n/a" if peak is None else f"{peak:.1f}"
    largest = max(report.rows, key=lambda r: r.size_bytes)
    where = f" with {cfg.peer}" if run.peer is not None else ""
    return (
        f"{prefix}busbw {shown} GB/s at {largest.size_bytes} B{where}, average {avg} GB/s over "
        f"{len(report.rows)} sizes; {_transport_word(transport)}",
        peak,
    )


def _transport_word(t: NcclTransport) -> str:
    return f"transport {describe(t)}"


def _bandwidth(
    b: ResultBuilder, report: NcclTestsReport, cfg: NcclSettings, subject: str | None, sample: bool
) -> float | None:
    largest = max(report.rows, key=lambda r: r.size_bytes)
    peak = largest.busbw_gbps
    if sample:
        b.sample(BUSBW, None if peak is None else peak * GB)
        b.sample(AVG_BUSBW, None if report.avg_busbw_gbps is None else report.avg_busbw_gbps * GB)
        b.sample(EXPECTED_BUSBW, None if cfg.expected_busbw_gbps is None else cfg.expected_busbw_gbps * GB)
    low = bandwidth_finding(report, cfg.expected_busbw_gbps, cfg.min_fraction)
    if low is not None:
        b.add(replace(low, subject=subject))
    return peak


def _peer_findings(run: ProbeRun, report: NcclTestsReport, cfg: NcclSettings) -> list[Finding]:
    """The peer's side of a cross-node run: its transport, and whether both sides measured the same."""
    from dgxdoctor.judge.nccl_rails import peer_agreement

    peer = run.peer
    if peer is None:
        return []
    peer_report = _report(peer)
    if peer.returncode != 0 or peer_report is None or not peer_report.rows:
        tail = (run.peer_error or peer.stderr.strip() or peer.stdout.strip())[-400:]
        return [peer_probe_failed(peer.returncode, cfg.peer, tail)]
    peer_transport = parse_nccl_info(peer.stdout + "\n" + peer.stderr)
    found = []
    if cfg.backend == "nccl" or peer_transport.seen:
        found = transport_findings(peer_transport, node_has_ib=peer.has_ib, subject=cfg.peer, cross_node=True)
    return found + peer_agreement(report, peer_report, cfg.peer or "peer")

"""Command line: parse args -> load config -> build checks -> run once or serve. Nothing else."""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dgxdoctor import __version__

# Each command imports what it needs when it runs: `--help` loads click alone, `check` no HTTP server, scheduler,
# dashboards, plan or bench code (benchmarks/startup.py measures it).
if TYPE_CHECKING:
    from dgxdoctor.checks.base import Check
    from dgxdoctor.config import Config
    from dgxdoctor.environment import Environment


class _AnalyzerKind(click.Choice):  # type: ignore[type-arg]
    """``--kind``: the analyzers' kinds, imported only when ``diagnose`` parses it or prints its help.

    The daemon (``dgxdoctor run``) goes through this module too and must not load every analyzer.
    """

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        from dgxdoctor.diagnose.registry import ANALYZERS

        return tuple(a.kind for a in ANALYZERS)

    @choices.setter
    def choices(self, value: object) -> None:
        pass


def _names(value: str | None, option: str) -> list[str] | None:
    """``--only a,b`` -> [a, b]; None when not given (or ``--skip ""``: a script's empty variable skips nothing);
    a usage error for a list that names nothing (``--only ,,``, ``--only ""``)."""
    if value is None or (option == "--skip" and not value.strip()):
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise click.UsageError(f"{option} {value!r} names no check")
    return names


def build_checks(
    config: Config, env: Environment, only: list[str] | None = None, skip: list[str] | None = None
) -> list[Check]:
    """Instantiate the enabled checks, in registry order. ``only`` overrides ``enabled = false``."""
    from dgxdoctor.checks.registry import ALL_CHECKS

    known = [f.name for f in ALL_CHECKS]
    unknown = sorted((set(only or []) | set(skip or [])) - set(known))
    if unknown:
        raise click.UsageError(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(known)}")
    both = sorted(set(only or []) & set(skip or []))
    if both:
        raise click.UsageError(f"--only and --skip both name {', '.join(both)}")
    checks: list[Check] = []
    for factory in ALL_CHECKS:
        settings = config.check_settings(factory.name)
        if only and factory.name not in only:
            continue
        if skip and factory.name in skip:
            continue
        if not only and not settings.enabled:
            continue
        check = factory(settings, env)
        progress = getattr(check, "attach_progress", None)
        if callable(progress):  # a long probe's progress, on stderr while it runs
            progress(lambda line: click.echo(line, err=True))
        checks.append(check)
    return checks


def _load(config_path: Path | None, warn: bool = True) -> Config:
    from dgxdoctor.config import EX_CONFIG, ConfigError, load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EX_CONFIG)
    for warning in config.warnings() if warn else ():
        click.echo(f"config warning: {warning}", err=True)
    return config


EX_USAGE = 64  # sysexits.h; 1-3 are taken by the Nagios statuses


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dgxdoctor")
def cli() -> None:
    """Health agent for vLLM served across DGX nodes: GPUs, IB/RoCE, NCCL, vLLM and Ray."""
    from dgxdoctor.daemon import logconfig

    logconfig.configure_commands()  # `run` replaces it with the daemon's structlog lines


def main() -> None:
    """Console entry point. Usage errors exit 64 so they never read as a Nagios status."""
    try:
        cli.main(standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
        sys.exit(EX_USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML config (default /etc/dgxdoctor/config.toml if present, else built-in defaults)",
)


@cli.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="print the JSON report")
@click.option("--only", help="comma-separated checks to run (even if disabled)")
@click.option("--skip", help="comma-separated checks not to run")
@click.option("-v", "--verbose", is_flag=True, help="show every finding, ok ones too")
@click.option("--cluster", is_flag=True, help="also every [daemon] peer, now, over the API; side by side, compared")
@click.option("--cached", is_flag=True, help="with --cluster: the peers' latest daemon results instead of a run now")
@click.option(
    "--deadline",
    "deadline_s",
    type=click.FloatRange(1, 600),
    default=None,
    help="with --cluster: seconds for the whole run, every node's checks and every peer's answer (default 15, "
    "5 with --cached; a slower check named with --only: its timeout + 5, at most 120)",
)
def check(
    config_path: Path | None,
    as_json: bool,
    only: str | None,
    skip: str | None,
    verbose: bool,
    cluster: bool,
    cached: bool,
    deadline_s: float | None,
) -> None:
    """Run every enabled check once, in parallel. Exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    from dgxdoctor.checks.base import CheckRunner
    from dgxdoctor.commands.report import report_dict, report_table
    from dgxdoctor.result import exit_code, overall_status

    # A one-shot run: the collections that importing every check triggers free nothing (6% of its start-up).
    gc.disable()
    try:
        config = _load(config_path)
        env = config.environment()
        checks = build_checks(config, env, _names(only, "--only"), _names(skip, "--skip"))
        if cluster:
            from dgxdoctor.commands.cluster import default_deadline

            deadline_s = deadline_s or default_deadline(checks, named=bool(only), cached=cached)
            sys.exit(_check_cluster(config, checks, as_json, verbose, cached, deadline_s))
        if cached or deadline_s is not None:
            raise click.UsageError("--cached and --deadline go with --cluster")
        results = CheckRunner(env).run_once_blocking(checks)
        if as_json:
            click.echo(json.dumps(report_dict(env.node, results, env.role, env.group), indent=2))
        else:
            click.echo(report_table(env.node, results, verbose, env.role))
    finally:
        gc.enable()
    sys.exit(exit_code(overall_status(results)))


def _check_cluster(
    config: Config, checks: list[Check], as_json: bool, verbose: bool, cached: bool, deadline_s: float
) -> int:
    from dgxdoctor.commands.cluster import run_cluster_check
    from dgxdoctor.config import EX_CONFIG
    from dgxdoctor.fleet.cluster import cluster_document
    from dgxdoctor.fleet.cluster_table import cluster_table
    from dgxdoctor.result import exit_code

    if not config.daemon.peers and config.fleet.prometheus_url is None:
        raise click.UsageError("--cluster needs the other nodes in [daemon] peers, or [fleet] prometheus_url")
    try:
        token = config.daemon.resolve_token()
    except (OSError, ValueError) as exc:
        click.echo(f"invalid configuration: daemon peer token: {exc}", err=True)
        return EX_CONFIG
    if token is None:
        from dgxdoctor.fleet.peers import NO_PEER_TOKEN

        click.echo(f"warning: {NO_PEER_TOKEN}", err=True)
    view = run_cluster_check(config, checks, token, deadline_s, cached)
    click.echo(json.dumps(cluster_document(view), indent=2) if as_json else cluster_table(view, verbose))
    return exit_code(view.status)


@cli.command()
@config_option
@click.option(
    "--listen",
    metavar="HOST:PORT",
    default=None,
    help="serve /metrics, /healthz and /state here (default from [daemon] listen)",
)
def run(config_path: Path | None, listen: str | None) -> None:
    """Run the daemon: scheduled checks, Prometheus /metrics, /state for peers, systemd notify."""
    import asyncio

    from dgxdoctor.config import EX_CONFIG, parse_listen
    from dgxdoctor.daemon import logconfig
    from dgxdoctor.daemon.service import Daemon

    config = _load(config_path, warn=False)  # the daemon logs them
    if listen is not None:
        try:
            parse_listen(listen)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--listen") from None
    logconfig.configure(config.daemon.log_level)
    try:
        daemon = Daemon(config, config_path, listen)
    except (OSError, ValueError) as exc:
        click.echo(f"invalid configuration: daemon token or TLS file: {exc}", err=True)
        sys.exit(EX_CONFIG)
    # Not asyncio.run(): at its end it joins the loop's executor threads, and the interpreter joins every
    # ThreadPoolExecutor's at exit. A thread stuck in a hung call (NVML, a dead NFS textfile directory) would then
    # hold the process after "stopped" until systemd's SIGKILL. The daemon has closed everything it owns by now.
    loop = asyncio.new_event_loop()
    code = loop.run_until_complete(daemon.serve())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(allow_dash=True, dir_okay=False))
@click.option("--kind", type=_AnalyzerKind(), default=None)
@click.option("--json", "as_json", is_flag=True, help="print the JSON report")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="judge with this config's check thresholds (expected busbw, IB rate, Ray nodes and GPUs)",
)
def diagnose(files: tuple[str, ...], kind: str | None, as_json: bool, config_path: Path | None) -> None:
    """Say what is wrong in pasted tool output (a file each, - for stdin)."""
    from dgxdoctor.commands.report import diagnose_dict, diagnose_text
    from dgxdoctor.diagnose.registry import CompressedInput
    from dgxdoctor.result import Status, exit_code

    settings = None
    if config_path is not None:
        config = _load(config_path)
        from dgxdoctor.commands.diagnose import thresholds

        settings = thresholds(config)

    inputs = []
    worst = Status.OK
    for name in files:
        try:
            readings = _diagnose_one(name, kind, settings)
        except OSError as exc:
            raise click.UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
        except CompressedInput as exc:
            shown = "FILE" if name == "-" else name
            raise click.UsageError(
                f"{name}: {exc}; read it with: {exc.reader} {shown} | dgxdoctor diagnose -"
            ) from None
        for diagnosis in readings:
            worst = Status.worst([worst, diagnosis.status])
            inputs.append((name, diagnosis))
    click.echo(json.dumps(diagnose_dict(inputs, worst), indent=2) if as_json else diagnose_text(inputs))
    sys.exit(exit_code(worst))


def _diagnose_one(name: str, kind: str | None, settings: Any) -> Sequence[Any]:
    """One input read as a stream (``diagnose.stream``): a notice on stderr for cut lines, progress on a terminal."""
    from dgxdoctor.diagnose.stream import StreamStats, diagnose_stream
    from dgxdoctor.sources.statefile import open_regular_file

    stats = StreamStats(progress=_progress(name) if sys.stderr.isatty() else None)
    if name == "-":
        found = diagnose_stream(sys.stdin.buffer, kind, settings, stats)
    else:
        with open_regular_file(name) as fh:  # a FIFO given by name would block open() forever
            found = diagnose_stream(fh, kind, settings, stats)
    if stats.bytes_read > PROGRESS_BYTES and stats.progress is not None:
        click.echo("", err=True)
    if stats.lines_cut:
        click.echo(
            f"note: {'<stdin>' if name == '-' else name}: {stats.lines_cut} line(s) longer than 64 KiB were cut "
            "to their first 64 KiB",
            err=True,
        )
    return found


PROGRESS_BYTES = 100 * 10**6


def _progress(name: str) -> Callable[[int], None]:
    """A progress line on the terminal for an input over ``PROGRESS_BYTES`` (a day of journalctl)."""
    shown = [0]

    def show(done: int) -> None:
        if done > PROGRESS_BYTES and done - shown[0] >= 64 * 2**20:
            shown[0] = done
            click.echo(f"\r{'<stdin>' if name == '-' else name}: {done / 1e6:,.0f} MB read", err=True, nl=False)

    return show


@cli.command()
@config_option
@click.option(
    "--since",
    "since",
    metavar="DURATION",
    default=None,
    help="window of logs: 900, 15m, 2h, 1d (default [bundle] since_s)",
)
@click.option("--cluster", is_flag=True, help="every [daemon] peer's part too, over the API, into one archive")
@click.option("-o", "--output", "output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="the archive (default ./dgxdoctor-bundle-NODE-TIME.tar.gz)")  # fmt: skip
@click.option("--size-cap", type=click.IntRange(2**16), default=None, help="bytes per node (default [bundle])")
@click.option("--deadline", "deadline_s", type=click.FloatRange(1, 3600), default=None,
              help="seconds for the whole collection (default [bundle] deadline_s)")  # fmt: skip
def bundle(
    config_path: Path | None,
    since: str | None,
    cluster: bool,
    output: Path | None,
    size_cap: int | None,
    deadline_s: float | None,
) -> None:
    """One .tar.gz for a support ticket: results, kernel and service logs, nvidia-smi, IB, Ray, NCCL env, audit."""
    from dgxdoctor.commands.bundle import parse_duration, run_bundle, with_limits

    config = with_limits(_load(config_path), size_cap, deadline_s)
    try:
        since_s = parse_duration(since) if since is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    if cluster and not config.daemon.peers:
        raise click.UsageError("--cluster needs the other nodes in [daemon] peers")
    if (
        cluster
        and config.daemon.token is None
        and config.daemon.token_file is None
        and config.daemon.peer_token_file is None
    ):
        from dgxdoctor.fleet.peers import NO_PEER_TOKEN

        click.echo(f"warning: {NO_PEER_TOKEN}", err=True)
    try:
        path, top = run_bundle(config, since_s, cluster, output)
    except OSError as exc:
        raise click.ClickException(f"cannot write the bundle: {exc}") from None
    click.echo(str(path))
    for node in top["nodes"]:
        offset = "" if node["clock_offset_s"] is None else f", clock {node['clock_offset_s']:+.3f} s"
        click.echo(f"  {node['node']}: {node['bytes'] or 0} bytes, {node['failures']} failed item(s){offset}"
                   + (f"; {node['error']}" if node["error"] else ""))  # fmt: skip
    for node, hit in top["limits_hit"].items():
        if hit:
            click.echo(f"  {node}: limits reached: {', '.join(sorted(hit))}", err=True)
    sys.exit(0 if not any(n["error"] for n in top["nodes"]) else 1)


@cli.command("config-example")
def config_example() -> None:
    """Print the documented example config (every key, its type, default and meaning)."""
    from dgxdoctor.commands.config_doc import example_config

    click.echo(example_config(), nl=False)


@cli.command()
@click.option(
    "--only",
    type=click.Choice(["recording", "alerts"]),
    default=None,
    help="print only the recording rules (peer comparison by median) or only the alert rules",
)
def rules(only: str | None) -> None:
    """Print the Prometheus rules (recording and alert rules) as one file for rule_files."""
    from dgxdoctor.alerts.rules import combined

    click.echo(combined((only,) if only else ("recording", "alerts")), nl=False)


@cli.group()
def remediation() -> None:
    """Remediation's state: mode, breaker, budget, last actions; reset the breaker; an operator's restart."""


@remediation.command("status")
@config_option
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
@click.option("--last", default=10, show_default=True, type=click.IntRange(1, 1000), help="actions to show")
def remediation_status(config_path: Path | None, as_json: bool, last: int) -> None:
    """Mode, role, breaker, budget left, an action in flight and the last actions (from the state dir)."""
    from dgxdoctor.remediation.status import render_status, status_document

    config = _load(config_path)
    try:
        doc = status_document(config, last)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the remediation state: {exc}") from None
    click.echo(json.dumps(doc, indent=2) if as_json else render_status(doc))


@remediation.command("restart")
@config_option
@click.option("--drain", is_flag=True, help="leave the balancer's rotation and let in-flight requests finish first")
def remediation_restart(config_path: Path | None, drain: bool) -> None:
    """Restart vLLM here now, through the daemon's guard and audit (act mode; the peer token)."""
    import httpx

    from dgxdoctor.commands.restart import planned_restart, render

    config = _load(config_path)
    try:
        status, doc = planned_restart(config, drain)
    except (OSError, ValueError, httpx.HTTPError) as exc:
        raise click.ClickException(f"cannot reach the local daemon: {type(exc).__name__}: {exc}") from None
    click.echo(render(doc))
    if status != 200 or doc.get("outcome") != "success":
        raise SystemExit(1)


@remediation.command("reset")
@config_option
def remediation_reset(config_path: Path | None) -> None:
    """Close the breaker and forget the budget, the ladder and the cooldowns (the daemon sees it at once)."""
    from dgxdoctor.remediation.status import reset

    config = _load(config_path)
    try:
        reset(config)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot reset the remediation state: {exc}") from None
    click.echo("remediation reset: breaker closed, budget restored")


@cli.command("slurm-health")
@config_option
@click.option("--node-name", help="this node's Slurm NodeName (default: $SLURMD_NODENAME, else the short host name)")
@click.option("--dry-run", is_flag=True, help="say what would be done to the node's record, change nothing")
def slurm_health(config_path: Path | None, node_name: str | None, dry_run: bool) -> None:
    """Slurm's HealthCheckProgram: drain this node on a CRITICAL in the daemon's latest results, resume a node it
    drained once that clears. Runs no probe. Exit 0 done, 69 the daemon gave no results (nothing changed), 70
    scontrol failed (docs/fleet.md)."""
    from dgxdoctor.commands.slurm_health import slurm_health as run_health
    from dgxdoctor.commands.slurm_health import slurm_node_name

    config = _load(config_path, warn=False)  # slurmd logs what it prints: one line, the outcome
    sys.exit(run_health(config, slurm_node_name(node_name), dry_run, click.echo))


@cli.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="print the conditions as JSON (node-problem-detector's format)")
@click.option(
    "--condition",
    "one",
    metavar="TYPE",
    help="one condition, as a node-problem-detector custom plugin: its message, exit 0 False, 1 True, 2 Unknown",
)
def conditions(config_path: Path | None, as_json: bool, one: str | None) -> None:
    """This node's conditions (GpuXidCritical, RdmaPortDown, NcclRankDead, ServingGroupStalled, ...) from the
    daemon's latest results, as Kubernetes node conditions. Exit 0 all False, 2 one True, 3 one Unknown."""
    from dgxdoctor.commands.conditions import conditions_document, conditions_table, exit_status, plugin_answer

    config = _load(config_path, warn=False)
    if one is not None:
        try:
            message, code = plugin_answer(config, one)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--condition") from None
        click.echo(message)
        sys.exit(code)
    doc = conditions_document(config)
    click.echo(json.dumps(doc, indent=2) if as_json else conditions_table(doc))
    sys.exit(exit_status(doc))


EX_DATAERR = 65  # sysexits.h: the input (a config.json) is unusable
# `plan`'s choices, spelled here so the daemon (which loads this module) does not import the planner;
# tests/unit/test_plan.py holds them equal to dgxdoctor.judge.plan's.
PLAN_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
PLAN_OVERHEAD_GIB = 4.0


class _DataError(click.ClickException):
    exit_code = EX_DATAERR


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--nodes", type=click.IntRange(1, 1024), default=2, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--gpu-memory", metavar="SIZE", help="memory of one GPU: 141GiB, 80GB, 143771MiB (default: NVML)")
@click.option("--max-model-len", type=click.IntRange(1), default=None, help="default: the model's own")
@click.option("--kv-cache-dtype", type=click.Choice(PLAN_KV_CACHE_DTYPES), default="auto", show_default=True)
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=0.9, show_default=True)
@click.option(
    "--overhead-gib",
    type=click.FloatRange(0),
    default=PLAN_OVERHEAD_GIB,
    show_default=True,
    help="assumed activation/CUDA graph/NCCL margin per GPU (vLLM measures it at start-up)",
)
@click.option("--network-gbps", type=click.FloatRange(0, min_open=True), help="RDMA bandwidth per node, Gb/s")
@click.option("--json", "as_json", is_flag=True, help="print the JSON plan")
def plan(
    model: Path,
    nodes: int,
    gpus_per_node: int,
    gpu_memory: str | None,
    max_model_len: int | None,
    kv_cache_dtype: str,
    gpu_memory_utilization: float,
    overhead_gib: float,
    network_gbps: float | None,
    as_json: bool,
) -> None:
    """How to cut MODEL (a directory or its config.json) over the GPUs: every TP x PP layout, judged by vLLM's
    rules, with its memory, and the recommended `vllm serve` line. Exit 0 with a recommendation, 2 if none fits."""
    from dgxdoctor.commands.plan_report import parse_memory, plan_dict, plan_text
    from dgxdoctor.judge.plan import PlanSettings, make_plan
    from dgxdoctor.sources.hf_model import ModelConfigError, read_model

    try:
        files = read_model(model)
    except ModelConfigError as exc:
        raise _DataError(str(exc)) from None
    memory = _gpu_memory(gpu_memory, parse_memory)
    settings = PlanSettings(
        gpu_memory_bytes=memory,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        overhead_bytes=int(overhead_gib * 2**30),
        network_gbps=network_gbps,
    )
    try:
        # vLLM takes the model's directory: `plan MODEL/config.json` serves MODEL
        serve_path = model.parent if model.name == "config.json" and not model.is_dir() else model
        result = make_plan(files.shape, str(serve_path), files.weight_bytes, files.weight_source, settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json.dumps(plan_dict(result), indent=2) if as_json else plan_text(result))
    sys.exit(0 if result.recommended else 2)


def _gpu_memory(text: str | None, parse: Callable[[str], int]) -> int:
    if text is not None:
        try:
            return parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--gpu-memory") from None
    from dgxdoctor.commands.plan_report import smallest_gpu_memory
    from dgxdoctor.environment import Environment
    from dgxdoctor.sources.nvml import NvmlError

    try:
        return smallest_gpu_memory(Environment().nvml_factory())[0]
    except NvmlError as exc:
        raise click.UsageError(f"give --gpu-memory: cannot read it through NVML ({exc})") from None


@cli.command("dashboards")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def dashboards(directory: Path) -> None:
    """Write the Grafana dashboards and a provisioning file for them into DIRECTORY (docs/dashboards.md)."""
    from dgxdoctor.dashboards import write_dashboards

    try:
        written = write_dashboards(directory)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot write the dashboards to {directory}: {exc}") from None
    for path in written:
        click.echo(str(path))


RUNBOOK_CONCURRENCY = "8,16,32,64,128"


def _concurrencies(value: str) -> list[int]:
    try:
        out = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of integers: {value!r}") from None
    if not out or out[0] < 1 or out[-1] > 100000:
        raise click.BadParameter("concurrencies must be 1..100000")
    return out


knee_options = [
    click.option(
        "--min-gain",
        type=click.FloatRange(0, 10),
        default=0.10,
        show_default=True,
        help="knee: a step whose throughput grows less than this fraction ...",
    ),
    click.option(
        "--max-tpot-growth",
        type=click.FloatRange(0, 100),
        default=0.20,
        show_default=True,
        help="... while P99 TPOT grows more than this fraction",
    ),
    click.option(
        "--out",
        "out_dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="where sweep.json, sweep.csv and sweep.png go",
    ),
    click.option("--json", "as_json", is_flag=True, help="print the sweep as JSON"),
]


def _with(options: Sequence[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def apply(fn: Any) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


@cli.group(invoke_without_command=True)
@config_option
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True, help="the vLLM server")
@click.option("--model", help="served model name (default: the server's first)")
@click.option("--tokenizer", help="tokenizer path or name (default: the model's)")
@click.option("--concurrency", "concurrency", default=RUNBOOK_CONCURRENCY, show_default=True)
@click.option("--input-len", type=click.IntRange(1), default=1024, show_default=True)
@click.option("--output-len", type=click.IntRange(1), default=256, show_default=True)
@click.option("--num-prompts", type=click.IntRange(1), default=None, help="per step (default: see the next option)")
@click.option(
    "--prompts-per-concurrency",
    type=click.IntRange(1, 1000),
    default=4,
    show_default=True,
    help="requests per step = this x the concurrency, at least 16",
)
@click.option("--serving-python", help="Python with vLLM (default: that of the running vLLM process)")
@click.option("--step-timeout-s", type=click.FloatRange(1), default=1800.0, show_default=True)
@click.option("--save-baseline", is_flag=True, help="store the sweep with its settings for the weekly check")
@_with(knee_options)
@click.pass_context
def bench(ctx: click.Context, /, config_path: Path | None, concurrency: str, **kw: Any) -> None:
    """Sweep concurrency with vLLM's own `vllm bench serve`, find the knee, write JSON, CSV and PNG."""
    if ctx.invoked_subcommand is not None:
        return
    from dgxdoctor.commands.bench import run_sweep_command

    config = _load(config_path)
    sys.exit(run_sweep_command(config, _concurrencies(concurrency), **kw))


@bench.command("analyze")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@_with(knee_options)
def bench_analyze(files: tuple[Path, ...], **kw: Any) -> None:
    """The same analysis on result files of `vllm bench serve --save-result` (one per concurrency)."""
    from dgxdoctor.commands.bench import analyze_command

    sys.exit(analyze_command(list(files), **kw))


@bench.command("compare")
@config_option
@click.option("--json", "as_json", is_flag=True, help="print the JSON result")
def bench_compare(config_path: Path | None, as_json: bool) -> None:
    """Run the weekly comparison now ([checks.bench]: requests at the baseline's knee), window or not."""
    from dgxdoctor.checks.bench import BenchCheck
    from dgxdoctor.commands.report import report_dict, report_table
    from dgxdoctor.result import exit_code

    config = _load(config_path)
    check = BenchCheck(config.check_settings("bench"), config.environment())
    result = check.run_now()
    env = config.environment()
    shown = report_dict(env.node, [result], group=env.group)
    click.echo(json.dumps(shown, indent=2) if as_json else report_table(env.node, [result]))
    sys.exit(exit_code(result.status))

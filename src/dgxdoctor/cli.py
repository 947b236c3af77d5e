"""Command line: parse args -> load config -> build checks -> run once or serve. Nothing else."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from dgxdoctor import __version__
from dgxdoctor.checks.base import Check, CheckRunner
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.config import DEFAULT_LISTEN, EX_CONFIG, Config, ConfigError, load_config, parse_listen
from dgxdoctor.environment import Environment
from dgxdoctor.report import overall_status, report_dict, report_table
from dgxdoctor.result import Status, exit_code

MAX_DIAGNOSE_BYTES = 64 * 1024 * 1024


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


def _names(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def build_checks(
    config: Config, env: Environment, only: list[str] | None = None, skip: list[str] | None = None
) -> list[Check]:
    """Instantiate the enabled checks, in registry order. ``only`` overrides ``enabled = false``."""
    known = [f.name for f in ALL_CHECKS]
    unknown = sorted((set(only or []) | set(skip or [])) - set(known))
    if unknown:
        raise click.UsageError(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(known)}")
    checks: list[Check] = []
    for factory in ALL_CHECKS:
        settings = config.check_settings(factory.name)
        if only and factory.name not in only:
            continue
        if skip and factory.name in skip:
            continue
        if not only and not settings.enabled:
            continue
        checks.append(factory(settings, env))
    return checks


def _load(config_path: Path | None) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EX_CONFIG)


EX_USAGE = 64  # sysexits.h; 1-3 are taken by the Nagios statuses


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dgxdoctor")
def cli() -> None:
    """Health agent for vLLM served across DGX nodes: GPUs, IB/RoCE, NCCL, vLLM and Ray."""


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
def check(config_path: Path | None, as_json: bool, only: str | None, skip: str | None, verbose: bool) -> None:
    """Run every enabled check once, in parallel. Exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    config = _load(config_path)
    env = config.environment()
    checks = build_checks(config, env, _names(only), _names(skip))
    results = asyncio.run(CheckRunner(env).run_all(checks))
    if as_json:
        click.echo(json.dumps(report_dict(env.node, results, env.role), indent=2))
    else:
        click.echo(report_table(env.node, results, verbose, env.role))
    sys.exit(exit_code(overall_status(results)))


@cli.command()
@config_option
@click.option(
    "--listen",
    metavar="HOST:PORT",
    default=None,
    help=f"serve /metrics, /healthz and /state here (default from [daemon] listen, {DEFAULT_LISTEN})",
)
def run(config_path: Path | None, listen: str | None) -> None:
    """Run the daemon: scheduled checks, Prometheus /metrics, /state for peers, systemd notify."""
    from dgxdoctor.daemon import logconfig
    from dgxdoctor.daemon.service import Daemon

    config = _load(config_path)
    if listen is not None:
        try:
            parse_listen(listen)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--listen") from None
    logconfig.configure(config.daemon.log_level)
    try:
        daemon = Daemon(config, config_path, listen)
    except (OSError, ValueError) as exc:
        click.echo(f"invalid configuration: daemon.token_file: {exc}", err=True)
        sys.exit(EX_CONFIG)
    sys.exit(asyncio.run(daemon.serve()))


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(allow_dash=True, dir_okay=False))
@click.option("--kind", type=_AnalyzerKind(), default=None)
@click.option("--json", "as_json", is_flag=True, help="print the JSON report")
def diagnose(files: tuple[str, ...], kind: str | None, as_json: bool) -> None:
    """Say what is wrong in pasted tool output (a file each, - for stdin)."""
    from dgxdoctor.diagnose.base import diagnose_text
    from dgxdoctor.diagnose.registry import ANALYZERS

    inputs = []
    worst = Status.OK
    for name in files:
        try:
            if name == "-":
                raw = sys.stdin.buffer.read(MAX_DIAGNOSE_BYTES + 1)
            else:
                with open(name, "rb") as fh:
                    raw = fh.read(MAX_DIAGNOSE_BYTES + 1)
        except OSError as exc:
            raise click.UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
        if len(raw) > MAX_DIAGNOSE_BYTES:
            raise click.UsageError(f"{name}: larger than {MAX_DIAGNOSE_BYTES // 2**20} MiB")
        diagnosis = diagnose_text(raw.decode("utf-8", errors="replace"), ANALYZERS, kind)
        worst = Status.worst([worst, diagnosis.status])
        inputs.append((name, diagnosis))
    if as_json:
        doc = {
            "inputs": [
                {
                    "source": "<stdin>" if name == "-" else name,
                    "kind": d.kind,
                    "findings": [f.to_diagnose_dict() for f in d.findings],
                    "data": d.data,
                }
                for name, d in inputs
            ]
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        for name, d in inputs:
            click.echo(f"{'<stdin>' if name == '-' else name}: {d.kind}, {d.status.value}")
            for f in d.findings:
                subject = f"{f.subject}: " if f.subject else ""
                click.echo(f"  [{f.status.value}] {f.code} {subject}{f.message}")
                if f.evidence:
                    click.echo(f"      evidence: {f.evidence}")
                if f.remedy:
                    click.echo(f"      remedy: {f.remedy}")
    sys.exit(exit_code(worst))


@cli.command("config-example")
def config_example() -> None:
    """Print the documented example config (every key, its type, default and meaning)."""
    from dgxdoctor.config_doc import example_config

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

"""What one node's part of a bundle holds, and where each file comes from.

The list follows what a support engineer asks for first (NVIDIA's nvidia-bug-report.sh, sosreport, the runbook's
preflight): the results, the kernel log of the window, the service logs' tails (files, the units' journal, and
``docker inspect`` and ``docker logs`` of vLLM's container where ``[node] container`` names one),
``nvidia-smi -q`` and ``topo -m``, the RDMA ports' counters, ``ray status``, the NCCL environment (the file and the
serving processes'), versions, the remediation audit and the config. Commands are argv lists run through the
environment's command runner.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from msgspec import Struct

from dgxdoctor import __version__
from dgxdoctor.bundle.collect import Item, Output, command_item
from dgxdoctor.config import Config
from dgxdoctor.environment import Environment
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.container import inspect_argv, logs_argv, serving
from dgxdoctor.sources.journal import journal_argv, parse_entry
from dgxdoctor.sources.kmsg import KmsgReader
from dgxdoctor.sources.logtail import expand_paths
from dgxdoctor.sources.procfs import ProcessInfo, iter_processes, runs_package, trusted_process
from dgxdoctor.validation import dump

# The tail kept of one service log file; the size cap bounds them all together.
LOG_TAIL_BYTES = 4 * 2**20
MAX_LOG_FILES = 40
# The newest entries kept of one unit's journal in the window (and as much output as a log file's tail, twice:
# journalctl's JSON carries the cursor and timestamps beside each line).
JOURNAL_TAIL_LINES = 50_000
# The agent's own unit (systemd/dgxdoctor.service): its journal says what it saw and did.
AGENT_UNIT = "dgxdoctor.service"
# The newest lines kept of vLLM's container log in the window (``docker logs --tail``).
CONTAINER_TAIL_LINES = 50_000
MAX_ENV_PROCESSES = 8
# Serving processes whose environment matters to NCCL (ray's workers hold vLLM's ranks).
SERVING_COMMS = ("raylet", "ray::", "vllm")

Provider = Callable[[], dict[str, Any]]


class Sources(Struct, frozen=True):
    """What the part reads that only its caller knows: the results document and /state (the daemon's store, or a
    fresh run and the local daemon's answer for `dgxdoctor bundle`)."""

    results: Provider
    state: Provider
    since_s: float
    bug_report: bool = True


def _json(provider: Provider) -> Callable[[float], Output]:
    def produce(_left: float) -> Output:
        return Output(json.dumps(provider(), indent=1, sort_keys=True, default=str).encode())

    return produce


def _file(path: Path, tail: int | None = None) -> Callable[[float], Output]:
    def produce(_left: float) -> Output:
        try:
            with path.open("rb") as fh:
                if tail is not None:
                    size = os.fstat(fh.fileno()).st_size
                    fh.seek(max(size - tail, 0))
                return Output(fh.read(tail if tail is not None else -1))
        except FileNotFoundError:
            return Output(status="missing", error=f"{path}: no such file")
        except OSError as exc:
            return Output(status="failed", error=f"{path}: {exc.strerror or exc}")

    return produce


def kernel_log(path: Path, since_s: float) -> Callable[[float], Output]:
    """The kernel ring's records of the window, each with its wall-clock time (kmsg stamps are monotonic)."""

    def produce(_left: float) -> Output:
        reader = KmsgReader(path)
        try:
            reader.open()
            records = reader.read_available()
        except OSError as exc:
            return Output(status="failed", error=f"{path}: {exc.strerror or exc}")
        finally:
            reader.close()
        now_wall, now_mono = time.time(), time.monotonic()
        lines = []
        for r in records:
            if r.usec is None:
                lines.append(r.message)
                continue
            age = now_mono - r.usec / 1e6
            if age <= since_s:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_wall - age))
                lines.append(f"{stamp}Z [{r.usec / 1e6:12.6f}] {r.message}")
        return Output(("\n".join(lines) + "\n").encode("utf-8", "replace"))

    return produce


def _log_items(kind: str, patterns: list[str], since_s: float) -> Iterator[Item]:
    """The tail of every log file written to within the window."""
    cutoff = time.time() - since_s
    files = []
    for path in expand_paths(patterns):
        try:
            if os.stat(path).st_mtime >= cutoff:
                files.append(path)
        except OSError:
            continue
    for path in files[:MAX_LOG_FILES]:
        safe = Path(path).name.replace(" ", "_")
        yield Item(f"logs/{kind}/{safe}", f"tail -c {LOG_TAIL_BYTES} {path}", _file(Path(path), LOG_TAIL_BYTES))


def journal_item(env: Environment, unit: str, directory: str | None, since_s: float, timeout_s: float) -> Item:
    """The newest entries of ``unit``'s journal in the window, oldest first, as ``journalctl -o short-iso`` prints
    them (read as JSON, newest first and bounded: a unit that logged a great deal keeps its end)."""
    shown = f"journalctl -u {unit} --since=-{since_s:g}s -o short-iso-precise" + (
        f" --directory={directory}" if directory else ""
    )

    def produce(left_s: float) -> Output:
        since_us = int((time.time() - since_s) * 1e6)
        argv = journal_argv([unit], directory=directory, since_us=since_us, lines=JOURNAL_TAIL_LINES, reverse=True)
        cmd, budget = tuple(argv), min(timeout_s, left_s)
        if budget <= 0:
            return Output(status="timeout", command=cmd, error="the bundle's deadline had passed")
        try:
            done = env.run_command_head(argv, budget, 2 * LOG_TAIL_BYTES)
        except CommandNotFound as exc:
            return Output(status="missing", command=cmd, error=str(exc))
        except (CommandTimeout, OSError) as exc:
            return Output(
                status="timeout" if isinstance(exc, CommandTimeout) else "failed", command=cmd, error=str(exc)
            )
        if done.returncode != 0 and not done.cut:
            return Output(done.stderr.encode("utf-8", "replace"), "failed", cmd, done.returncode,
                          f"exit {done.returncode}: {done.stderr.strip()[-300:]}")  # fmt: skip
        entries = [e for e in (parse_entry(line, [unit]) for line in done.stdout.splitlines()) if e is not None]
        lines = [f"# {shown}: the newest {len(entries)} entries of the window kept"] if done.cut else []
        for e in reversed(entries):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(e.realtime_us / 1e6))
            lines.append(f"{stamp}.{e.realtime_us % 1_000_000:06d}Z {e.unit or unit}[{e.pid or '-'}]: {e.message}")
        return Output(("\n".join(lines) + "\n").encode("utf-8", "replace") if lines else b"", "ok", cmd, 0)

    return Item(f"logs/journal/{unit}.log", shown, produce)


def container_items(env: Environment, since_s: float, timeout_s: float) -> list[Item]:
    """vLLM's container (``[node] container``): ``inspect`` (its state, image, mounts, devices and environment,
    redacted with the rest of the part) and its log's tail in the window, stdout and stderr in order."""
    box = env.container
    if box is None:
        return []
    argv = logs_argv(box, int((time.time() - since_s) * 1e9), CONTAINER_TAIL_LINES)
    shown = " ".join(box.argv("logs", f"--since={since_s:g}s", "--timestamps", f"--tail={CONTAINER_TAIL_LINES}"))

    def produce(left_s: float) -> Output:
        cmd, budget = tuple(argv), min(timeout_s, left_s)
        if budget <= 0:
            return Output(status="timeout", command=cmd, error="the bundle's deadline had passed")
        try:
            done = env.run_command_merged(argv, budget, 2 * LOG_TAIL_BYTES)
        except CommandNotFound as exc:
            return Output(status="missing", command=cmd, error=str(exc))
        except (CommandTimeout, OSError) as exc:
            return Output(
                status="timeout" if isinstance(exc, CommandTimeout) else "failed", command=cmd, error=str(exc)
            )
        data = done.stdout.encode("utf-8", "replace")
        if done.cut:
            data += f"\n# {shown}: cut at {2 * LOG_TAIL_BYTES} bytes\n".encode()
        if done.returncode != 0 and not done.cut:
            return Output(data, "failed", cmd, done.returncode, f"exit {done.returncode}: {done.stdout.strip()[-300:]}")
        return Output(data, "ok", cmd, 0)

    return [
        command_item(f"container/{box.name}-inspect.json", inspect_argv(box), timeout_s, env.run_command),
        Item(f"container/{box.name}.log", shown, produce),
    ]


def journal_items(config: Config, env: Environment, since_s: float) -> list[Item]:
    """The journal of the units the logs check follows, of the fabric manager and of the agent itself."""
    from dgxdoctor.checks.driver_stack import DriverStackSettings
    from dgxdoctor.checks.logs import LogsSettings

    logs = config.settings_of("logs", LogsSettings)
    fabric = config.settings_of("driver_stack", DriverStackSettings).fabric_manager_unit
    units = list(dict.fromkeys([*logs.journal_units, fabric, AGENT_UNIT]))
    t = config.bundle.command_timeout_s
    return [journal_item(env, unit, logs.journal_directory, since_s, t) for unit in units]


def infiniband(env: Environment, timeout_s: float) -> Item:
    """The RDMA ports' state, rate and every counter from sysfs; ``ibstat`` where sysfs shows no device."""
    root = env.sysfs_root / "class" / "infiniband"
    if not root.is_dir():
        return command_item("infiniband.txt", ["ibstat"], timeout_s, env.run_command)

    def produce(_left: float) -> Output:
        lines = []
        for port in sorted(root.glob("*/ports/*")):
            device = port.parent.parent.name
            for f in sorted([*port.glob("*"), *port.glob("counters/*"), *port.glob("hw_counters/*")]):
                if f.is_file():
                    try:
                        value = f.read_text(errors="replace").strip()
                    except OSError as exc:
                        value = f"<unreadable: {exc.strerror}>"
                    lines.append(f"{device}/{port.name}/{f.relative_to(port)}: {value}")
        return Output(("\n".join(lines) + "\n").encode())

    return Item("infiniband.txt", f"grep -r . {root}/*/ports/*", produce)


def nccl_environment(config: Config, env: Environment) -> Callable[[float], Output]:
    """The NCCL env file and the serving processes' environments and command lines, redacted by construction
    (``bundle/environ.py``: only the values of names known to be harmless) and with the rest of the part."""
    from dgxdoctor.bundle.environ import argv_flags, env_file_lines, process_lines
    from dgxdoctor.checks.drift import DriftSettings
    from dgxdoctor.checks.nccl_env import NcclEnvSettings  # the checks load when a bundle is built, not imported

    env_file = config.settings_of("nccl_env", NcclEnvSettings).env_file
    serving_python = config.settings_of("drift", DriftSettings).serving_python

    def produce(left_s: float) -> Output:
        out = [
            f"# {env_file}",
            *(env_file_lines(env_file, env.host_root) if env_file else ["(no env_file configured)"]),
        ]
        procs = _serving_processes(env)
        flags = argv_flags(serving_python, env.proc_root, env.run_command, left_s) if procs else {}
        for proc in procs:
            out += process_lines(proc, flags)
        return Output(("\n".join(out) + "\n").encode())

    return produce


def _serving_processes(env: Environment) -> list[ProcessInfo]:
    """Ray's and vLLM's processes of root, dgxdoctor's user or ``[node] serving_user`` (another user's look-alikes
    would fill the eight places with what they chose to put in their environment); with ``[node] container``, those
    of the container (whatever their uid) first."""
    found = []
    boxed = serving(env.run_command, env.proc_root, env.container).members if env.container is not None else []
    mine = {p.pid for p in boxed}
    for proc in [*boxed, *(p for p in iter_processes(env.proc_root) if p.pid not in mine)]:
        try:
            serving_one = proc.comm.startswith(SERVING_COMMS) or runs_package(proc.cmdline, "vllm")
            if serving_one and (proc.pid in mine or trusted_process(proc.uid, None, env.serving_uid)):
                found.append(proc)
        except OSError:
            continue
        if len(found) >= MAX_ENV_PROCESSES:
            break
    return found


def versions(env: Environment) -> Callable[[float], Output]:
    def produce(_left: float) -> Output:
        doc: dict[str, Any] = {
            "dgxdoctor": __version__,
            "python": sys.version,
            "platform": platform.platform(),
            "kernel": platform.release(),
        }
        for key, path in (("nvidia_driver", "driver/nvidia/version"), ("cmdline", "cmdline")):
            try:
                doc[key] = (env.proc_root / path).read_text(errors="replace").strip()
            except OSError:
                doc[key] = None
        return Output(json.dumps(doc, indent=1).encode())

    return produce


def bug_report(env: Environment, timeout_s: float) -> Item:
    """``nvidia-bug-report.sh --safe-mode`` (no commands that can hang on a broken GPU), time-boxed."""
    argv = ["nvidia-bug-report.sh", "--safe-mode", "--output-file"]

    def produce(left_s: float) -> Output:
        with tempfile.TemporaryDirectory(prefix="dgxdoctor-bug-") as tmp:
            target = Path(tmp) / "nvidia-bug-report.log.gz"
            done = command_item("x", [*argv, str(target)], timeout_s, env.run_command).produce(left_s)
            if done.status != "ok":
                return done
            try:
                return Output(gzip.decompress(target.read_bytes()), "ok", done.command, done.exit_code)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                return Output(status="failed", command=done.command, error=f"{target}: {exc}")

    return Item("nvidia-bug-report.log", " ".join(argv) + " FILE", produce)


def config_dump(config: Config) -> Callable[[float], Output]:
    """The configuration in force, as JSON (secrets masked by the dump and redacted again)."""

    def produce(_left: float) -> Output:
        doc = dump(config.model)
        doc["source"] = config.source
        return Output(json.dumps(doc, indent=1, sort_keys=True).encode())

    return produce


def node_items(config: Config, env: Environment, src: Sources) -> list[Item]:
    b = config.bundle
    t = b.command_timeout_s
    from dgxdoctor.checks.logs import LogsSettings
    from dgxdoctor.checks.ray import RaySettings

    ray_cmd = config.settings_of("ray", RaySettings).ray_command
    logs = config.settings_of("logs", LogsSettings)
    state_dir = config.paths.state_dir
    items = [
        Item("results.json", "dgxdoctor check --json", _json(src.results)),
        Item("state.json", "curl -H 'Authorization: Bearer ...' localhost:9835/state", _json(src.state)),
        Item("kernel.log", f"dmesg (the last {src.since_s:g} s of {env.kmsg_path})", kernel_log(env.kmsg_path,
                                                                                              src.since_s)),
        command_item("nvidia-smi-q.txt", ["nvidia-smi", "-q"], t, env.run_command),
        command_item("nvidia-smi-topo-m.txt", ["nvidia-smi", "topo", "-m"], t, env.run_command),
        infiniband(env, t),
        command_item("ray-status.txt", [ray_cmd, "status"], t, env.run_command),
        Item("nccl-env.txt", "cat the env file; tr '\\0' '\\n' < /proc/PID/environ", nccl_environment(config, env)),
        Item("versions.json", "uname -a; cat /proc/driver/nvidia/version", versions(env)),
        Item("remediation-audit.jsonl", f"tail {state_dir}/remediation.jsonl",
             _file(state_dir / "remediation.jsonl", LOG_TAIL_BYTES)),
        Item("remediation-state.json", f"cat {state_dir}/remediation-state.json",
             _file(state_dir / "remediation-state.json")),
        Item("config.json", f"the configuration in force ({config.source})", config_dump(config)),
    ]  # fmt: skip
    items += _log_items("vllm", list(logs.vllm_paths), src.since_s)
    items += _log_items("ray", list(logs.ray_paths), src.since_s)
    items += journal_items(config, env, src.since_s)
    items += container_items(env, src.since_s, t)
    if src.bug_report and shutil.which("nvidia-bug-report.sh"):
        items.append(bug_report(env, b.bug_report_timeout_s))
    return items


def known_secrets(config: Config) -> list[str | None]:
    """The secret values this node's configuration holds, removed wherever they appear."""
    out: list[str | None] = []
    with contextlib.suppress(OSError, ValueError):
        creds = config.daemon.resolve_credentials()
        out += [creds.read, creds.alert, creds.peer]
    from dgxdoctor.checks.ray import RaySettings
    from dgxdoctor.checks.vllm import VllmSettings

    key = config.settings_of("vllm", VllmSettings).api_key
    out.append(key.get_secret_value() if key is not None else None)
    token_file = config.settings_of("ray", RaySettings).auth_token_file
    if token_file is not None:
        with contextlib.suppress(OSError):
            out.append(Path(token_file).read_text(errors="replace").strip())
    return out

"""NCCL environment (the tutorial's step 3): /etc/profile.d/nccl.sh and a running process's environment,
checked against this host's interfaces, RDMA devices, GID table and addresses.

By hand: ``cat /etc/profile.d/nccl.sh; tr '\\0' '\\n' < /proc/$(pgrep -o raylet)/environ | grep -E 'NCCL|GLOO|VLLM';
ip -br addr; ls /sys/class/infiniband; show_gids``.

The file is parsed with shlex as data and never sourced. With ``[node] container`` (docs/container.md) the process
is the container's (its ``process_name`` process, else its vLLM server, else its first process, whatever their uid),
and where its ``/proc/<pid>/environ`` cannot be read, the environment the container was created with (``docker
inspect``'s ``Config.Env``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.nccl_env import compare_envs, evaluate_nccl_env
from dgxdoctor.judge.presence import nccl_env_absent
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.container import Container, parse_environ_list, serving
from dgxdoctor.sources.nccl_env import (
    env_facts,
    kernel_interface_names,
    parse_environ,
    read_env_file,
    read_net_interfaces,
    watched,
)
from dgxdoctor.sources.procfs import iter_processes, trusted_process
from dgxdoctor.sources.sysfs_ib import ports_by_device

NCCL_ENV_VARS = MetricSpec(
    "dgxdoctor_nccl_env_variables", "NCCL_*/GLOO_*/VLLM_HOST_IP variables set in the checked environment"
)


def local_addresses() -> set[str]:
    """Every IPv4/IPv6 address of this host's interfaces (psutil imported here: only a node with an NCCL
    environment to check needs it, so a daemon without one never loads it)."""
    import psutil

    found: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                found.add(addr.address)
    return found


class NcclEnvSettings(CheckSettings, frozen=True):
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 120.0
    env_file: Annotated[
        Path | None,
        Meta(description="the NCCL environment file, read as data with the files it sources (`. FILE`); never run"),
    ] = Path("/etc/profile.d/nccl.sh")
    process_name: Annotated[
        str | None,
        Meta(
            description='a running process whose environment is checked and compared with env_file, e.g. "raylet" '
            'or "vllm"; unset: only the file'
        ),
    ] = None
    require_nccl_debug: Annotated[
        bool, Meta(description="warn when NCCL_DEBUG is unset (the tutorial keeps WARN on)")
    ] = True


class NcclEnvCheck(Check[NcclEnvSettings]):
    name: ClassVar[str] = "nccl_env"

    def __init__(
        self,
        settings: CheckSettings,
        env: Environment,
        addresses: Callable[[], set[str]] | None = None,
        interface_names: Callable[[], Sequence[str]] = kernel_interface_names,
    ) -> None:
        super().__init__(settings, env)
        self.addresses = addresses or local_addresses
        self.interface_names = interface_names

    def _file_values(self, b: ResultBuilder, missing: list[str]) -> dict[str, str] | None:
        """The variables env_file sets; its unparsable lines are said (OK: nothing sources them)."""
        path = self.settings.env_file
        if path is None:
            return None
        if not path.is_file():
            missing.append(f"{path} absent")
            return None
        parsed = read_env_file(path, self.env.host_root)
        for line, problem in parsed.problems:
            b.add(Finding("NCCL_ENV_FILE_LINE", Status.OK, f"line {line}: {problem}", f"{path}:{line}"))
        return parsed.values

    def _container_values(
        self, box: Container, name: str | None, missing: list[str]
    ) -> tuple[dict[str, str] | None, str]:
        """``[node] container``: the environment of its process_name process (any uid: the container's), else of
        its vLLM server, else of its first process, from ``/proc/<pid>/environ``; where that cannot be read, the
        environment the container was created with (``docker inspect``'s ``Config.Env``)."""
        boxed = serving(self.env.run_command, self.env.proc_root, box)
        if boxed.state is None or not boxed.state.running:
            missing.append(boxed.why_none())
            return None, ""
        named = [p for p in boxed.members if name and p.matches(name) and p.alive]
        first = [p for p in boxed.members if p.pid == boxed.state.pid]
        for proc in [*named[:1], *([boxed.server] if boxed.server is not None else []), *first]:
            try:
                label = f"{name or 'vllm'} (pid {proc.pid}, container {boxed.container.name})"
                return parse_environ(proc.environ()), label
            except OSError:
                continue
        return parse_environ_list(boxed.state.env), f"container {boxed.container.name} (docker inspect Config.Env)"

    def _process_values(self, b: ResultBuilder, missing: list[str]) -> tuple[dict[str, str] | None, str]:
        """(the environment of the oldest process_name process, its label)."""
        name = self.settings.process_name
        box = self.env.container
        if box is not None:
            return self._container_values(box, name, missing)
        if not name:
            return None, ""
        me = os.getpid()
        serving_uid = self.env.serving_uid
        found = sorted(  # of root, dgxdoctor's user or [node] serving_user: anyone can run a program named raylet
            (p for p in iter_processes(self.env.proc_root)
             if p.pid != me and p.matches(name) and p.alive and trusted_process(p.uid, None, serving_uid)),
            key=lambda p: p.pid,
        )  # fmt: skip
        if not found:
            missing.append(f"no {name} process")
            return None, ""
        proc = found[0]
        label = f"{name} (pid {proc.pid})"
        try:
            return parse_environ(proc.environ()), label
        except PermissionError:
            b.add(
                Finding(
                    "NCCL_ENV_PROCESS_UNREADABLE",
                    Status.UNKNOWN,
                    f"cannot read the environment of {label}: permission denied",
                    name,
                    remedy="run dgxdoctor as root or as the user that runs the process",
                )
            )
        except OSError:  # ENOENT/ESRCH: it exited between listing and reading
            missing.append(f"{label} exited")
        return None, label

    def run(self) -> CheckResult:
        s = self.settings
        b = ResultBuilder(self.name)
        missing: list[str] = []
        file_values = self._file_values(b, missing)
        proc_values, proc_label = self._process_values(b, missing)
        if file_values is None and proc_values is None:
            reason = "; ".join(missing) if missing else "neither env_file nor process_name configured"
            required = nccl_env_absent(self.env.role, reason)
            if required is not None:
                b.add(required)
            elif not b.findings:
                return CheckResult.skipped(self.name, f"no NCCL environment to check: {reason}")
            return b.build(f"no NCCL environment: {reason}")
        file_label = str(s.env_file)
        effective = proc_values if proc_values is not None else file_values
        assert effective is not None
        source = proc_label if proc_values is not None else file_label
        interfaces = read_net_interfaces(self.env.sysfs_root, self.interface_names)
        ib_ports = ports_by_device(self.env.sysfs_root, counters=False, gids=True)
        b.add(*evaluate_nccl_env(effective, interfaces, ib_ports, self.addresses(), require_debug=s.require_nccl_debug))
        if file_values is not None and proc_values is not None:
            b.add(*compare_envs(file_values, file_label, proc_values, proc_label))
        b.facts.update(env_facts(effective))
        b.sample(NCCL_ENV_VARS, len(watched(effective)))
        return b.build(_summary(b, source, len(watched(effective)), missing))


def _summary(b: ResultBuilder, source: str, watched_count: int, missing: list[str]) -> str:
    bad = [f for f in b.findings if f.status in (Status.WARNING, Status.CRITICAL, Status.UNKNOWN)]
    if bad:
        summary = f"{source}: " + "; ".join(f.message for f in bad[:3])
        if len(bad) > 3:
            summary += f" (+{len(bad) - 3} more)"
    else:
        summary = f"{source}: {watched_count} NCCL/GLOO/VLLM variables consistent with this host"
    if missing:
        summary += " (" + "; ".join(missing) + ")"
    return summary

"""Host prerequisites: RAM and disk against the model's weights, free space, required processes.

By hand: ``free -b; df -B1 / /tmp/ray <model_dir>; du -cb <model_dir>/**/*.safetensors; pgrep -a raylet``.

The tutorial ("环境与前置条件"): system RAM >= 1.5x the weights (they pass through host memory while loading)
and disk >= 2x the weights. Both are prerequisites, not faults: a shortfall is a WARNING. A filesystem
below ``disk_critical_free_percent`` is CRITICAL: Ray and vLLM fail on a full /tmp or root. A required
process that is not running is CRITICAL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import psutil
from pydantic import Field, model_validator

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.procfs import iter_processes

HOST_MEMORY_TOTAL = MetricSpec("dgxdoctor_host_memory_total_bytes", "Total system memory (RAM)")
HOST_MEMORY_AVAILABLE = MetricSpec(
    "dgxdoctor_host_memory_available_bytes", "System memory available to new work without swapping (MemAvailable)"
)
HOST_SWAP_USED = MetricSpec("dgxdoctor_host_swap_used_bytes", "Swap space in use")
HOST_LOAD1_PER_CPU = MetricSpec("dgxdoctor_host_load1_per_cpu", "1-minute load average divided by the CPU count")
HOST_FS_FREE = MetricSpec(
    "dgxdoctor_host_filesystem_free_bytes",
    "Free bytes (available to unprivileged users) on the filesystem holding a watched path",
    labels=("path",),
)
HOST_FS_SIZE = MetricSpec(
    "dgxdoctor_host_filesystem_size_bytes", "Size of the filesystem holding a watched path", labels=("path",)
)
HOST_PROCESS_UP = MetricSpec(
    "dgxdoctor_host_process_up", "1 when a required process is running, 0 when not", labels=("process",)
)
HOST_MODEL_WEIGHTS = MetricSpec(
    "dgxdoctor_host_model_weights_bytes",
    "Size of the model weight files (*.safetensors, *.bin, *.pt, *.gguf) under the configured model directory",
)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")

REMEDY_MEMORY = (
    "Weights pass through host RAM while vLLM loads them: add memory, use a smaller model or quantisation, "
    "or expect the load to swap or be OOM-killed."
)
REMEDY_DISK_WEIGHTS = "Free space on the model's filesystem (old checkpoints, caches) or move the weights."
REMEDY_DISK_FULL = (
    "Free space now: old Ray sessions under /tmp/ray/session_*, rotated vLLM logs, core dumps; "
    "`du -xh --max-depth=2 <path> | sort -h | tail` shows where it went."
)
REMEDY_PROCESS = "Start it again (systemctl start <unit>, or the Ray/vLLM start script) and read its last log lines."


class HostSettings(CheckSettings):
    interval_s: float = Field(60.0, gt=0, description="daemon: seconds between runs")
    model_dir: Path | None = Field(
        None, description="directory of the served model's weights (the same path on every node); unset: skipped"
    )
    weights_bytes: int | None = Field(
        None, ge=0, description="size of the weights in bytes, instead of summing the files under model_dir"
    )
    memory_ratio: float = Field(1.5, gt=0, description="system RAM must be at least this many times the weights")
    disk_ratio: float = Field(
        2.0, gt=0, description="free space on the model's filesystem must be at least this many times the weights"
    )
    ray_log_dir: Path = Field(Path("/tmp/ray"), description="Ray's temp and log directory (ray start --temp-dir)")
    root_path: Path = Field(Path("/"), description="the root filesystem's mount point")
    extra_paths: list[Path] = Field(
        default_factory=list, description="more paths whose filesystem's free space is watched"
    )
    disk_warn_free_percent: float = Field(
        10.0, ge=0, le=100, description="warn when a watched filesystem has less than this percent free"
    )
    disk_critical_free_percent: float = Field(
        3.0, ge=0, le=100, description="critical when a watched filesystem has less than this percent free"
    )
    memory_available_warn_percent: float = Field(
        5.0, ge=0, le=100, description="warn when less than this percent of RAM is available"
    )
    required_processes: list[str] = Field(
        default_factory=list,
        description="processes that must be running, matched against process name and command line, e.g. "
        '["raylet", "vllm"]; a missing one is critical',
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> HostSettings:
        if self.disk_critical_free_percent > self.disk_warn_free_percent:
            raise ValueError("disk_critical_free_percent must not exceed disk_warn_free_percent")
        if any(not name.strip() for name in self.required_processes):
            raise ValueError("required_processes entries must not be empty")
        return self


@dataclass(frozen=True)
class DiskUsage:
    total: int
    free: int


class HostProbe(Protocol):
    """Memory, load and disk as the host check reads them; psutil by default, a fake in tests. Processes are
    read from ``env.proc_root`` (sources.procfs)."""

    def memory(self) -> tuple[int, int]:
        """(total, available) bytes."""
        ...

    def swap_used(self) -> int | None: ...

    def load1_per_cpu(self) -> float | None: ...

    def disk_usage(self, path: Path) -> DiskUsage: ...


class PsutilProbe:
    def memory(self) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)

    def swap_used(self) -> int | None:
        try:
            return int(psutil.swap_memory().used)
        except (OSError, RuntimeError):
            return None

    def load1_per_cpu(self) -> float | None:
        cpus = psutil.cpu_count() or 0
        if not cpus:
            return None
        return float(os.getloadavg()[0]) / cpus

    def disk_usage(self, path: Path) -> DiskUsage:
        usage = psutil.disk_usage(str(path))
        return DiskUsage(int(usage.total), int(usage.free))


def weights_size(model_dir: Path) -> tuple[int, int]:
    """(bytes, files) of weight files under ``model_dir``. Symlinked files (Hugging Face cache snapshots
    point into blobs/) are followed and counted once per inode; directory symlinks are not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(model_dir):
        for name in files:
            if not name.endswith(WEIGHT_SUFFIXES):
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # a dangling link (an incomplete download) holds no bytes
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_size
    return total, len(seen)


def existing_ancestor(path: Path) -> Path:
    """The path itself or its nearest existing parent: /tmp/ray before Ray ever ran lives on /tmp's fs."""
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def evaluate_free_space(label: str, usage: DiskUsage, warn_percent: float, critical_percent: float) -> Finding | None:
    if usage.total <= 0:
        return None
    percent = 100.0 * usage.free / usage.total
    if percent < critical_percent:
        status = Status.CRITICAL
    elif percent < warn_percent:
        status = Status.WARNING
    else:
        return None
    return Finding(
        "HOST_DISK_LOW",
        status,
        f"{percent:.1f}% free ({_gib(usage.free)} of {_gib(usage.total)}) on the filesystem of {label}",
        label,
        remedy=REMEDY_DISK_FULL,
    )


def evaluate_weights(
    weights: int, memory_total: int, disk_free: int | None, memory_ratio: float, disk_ratio: float, model_dir: str
) -> list[Finding]:
    findings: list[Finding] = []
    if memory_total < memory_ratio * weights:
        findings.append(
            Finding(
                "HOST_MEMORY_BELOW_WEIGHTS",
                Status.WARNING,
                f"system RAM {_gib(memory_total)} is below {memory_ratio:g}x the weights ({_gib(weights)})",
                "memory",
                remedy=REMEDY_MEMORY,
            )
        )
    if disk_free is not None and disk_free < disk_ratio * weights:
        findings.append(
            Finding(
                "HOST_DISK_BELOW_WEIGHTS",
                Status.WARNING,
                f"{_gib(disk_free)} free on the filesystem of {model_dir}, below {disk_ratio:g}x the weights "
                f"({_gib(weights)})",
                model_dir,
                remedy=REMEDY_DISK_WEIGHTS,
            )
        )
    return findings


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


class HostCheck(Check):
    name: ClassVar[str] = "host"
    settings_model: ClassVar[type[CheckSettings]] = HostSettings

    def __init__(self, settings: CheckSettings, env: Environment, probe: HostProbe | None = None) -> None:
        self.settings: CheckSettings = settings
        settings = own_settings(self.name, settings, HostSettings)
        self.cfg: HostSettings = settings
        self.env = env
        self.probe: HostProbe = probe or PsutilProbe()

    def run(self) -> CheckResult:
        s = self.cfg
        b = ResultBuilder(self.name)
        notes: list[str] = []

        total, available = self.probe.memory()
        b.sample(HOST_MEMORY_TOTAL, total)
        b.sample(HOST_MEMORY_AVAILABLE, available)
        b.sample(HOST_SWAP_USED, self.probe.swap_used())
        b.sample(HOST_LOAD1_PER_CPU, self.probe.load1_per_cpu())
        b.facts["host.memory_total_gib"] = str(round(total / 2**30))
        if total > 0 and 100.0 * available / total < s.memory_available_warn_percent:
            b.add(
                Finding(
                    "HOST_MEMORY_LOW_AVAILABLE",
                    Status.WARNING,
                    f"only {_gib(available)} of {_gib(total)} RAM available",
                    "memory",
                    remedy="find the consumer with `ps aux --sort=-rss | head`; vLLM's host swap space and Ray's "
                    "object store both live in RAM",
                )
            )

        watched = [("/", s.root_path), ("ray_log_dir", s.ray_log_dir)] + [(str(p), p) for p in s.extra_paths]
        disks: list[str] = []
        for _kind, path in watched:
            usage = self.probe.disk_usage(existing_ancestor(path))
            disks.append(f"{path} {_gib(usage.free)} free of {_gib(usage.total)}")
            b.sample(HOST_FS_FREE, usage.free, path=str(path))
            b.sample(HOST_FS_SIZE, usage.total, path=str(path))
            finding = evaluate_free_space(str(path), usage, s.disk_warn_free_percent, s.disk_critical_free_percent)
            if finding is not None:
                b.add(finding)

        self._weights(b, total, notes)
        self._processes(b)

        bad = [f for f in b.findings if f.status in (Status.WARNING, Status.CRITICAL)]
        healthy = f"RAM {_gib(total)}, {_gib(available)} available; disk {', '.join(disks)}"
        summary = "; ".join(f.message for f in bad[:3]) if bad else healthy
        if notes:
            summary += " (" + "; ".join(notes) + ")"
        return b.build(summary)

    def _weights(self, b: ResultBuilder, memory_total: int, notes: list[str]) -> None:
        s = self.cfg
        if s.model_dir is None and s.weights_bytes is None:
            notes.append("model_dir not configured: weights size not checked")
            return
        disk_free: int | None = None
        label = str(s.model_dir) if s.model_dir else "model"
        if s.model_dir is not None:
            if not s.model_dir.is_dir():
                b.add(
                    Finding(
                        "HOST_MODEL_DIR_MISSING",
                        Status.CRITICAL,
                        f"model directory {s.model_dir} does not exist on this node",
                        label,
                        remedy="mount the shared model filesystem or copy the weights to the same path on every node",
                    )
                )
                return
            usage = self.probe.disk_usage(s.model_dir)
            disk_free = usage.free
            b.sample(HOST_FS_FREE, usage.free, path=str(s.model_dir))
            b.sample(HOST_FS_SIZE, usage.total, path=str(s.model_dir))
        if s.weights_bytes is not None:
            weights = s.weights_bytes
        else:
            assert s.model_dir is not None
            weights, files = weights_size(s.model_dir)
            if files == 0:
                b.add(
                    Finding(
                        "HOST_MODEL_NO_WEIGHTS",
                        Status.WARNING,
                        f"no *.safetensors/*.bin/*.pt/*.gguf files under {s.model_dir}",
                        label,
                        remedy="check model_dir points at the model (the directory holding config.json)",
                    )
                )
                return
        b.sample(HOST_MODEL_WEIGHTS, weights)
        b.facts["host.model_weights_bytes"] = str(weights)
        b.add(*evaluate_weights(weights, memory_total, disk_free, s.memory_ratio, s.disk_ratio, label))

    def _processes(self, b: ResultBuilder) -> None:
        wanted = self.cfg.required_processes
        if not wanted:
            return
        me = os.getpid()
        # One listing for every name: each process's comm and cmdline are read once.
        running = [p for p in iter_processes(self.env.proc_root) if p.pid != me]
        for name in wanted:
            found = sorted((p for p in running if p.matches(name) and p.alive), key=lambda p: p.pid)
            b.sample(HOST_PROCESS_UP, 1 if found else 0, process=name)
            if found:
                b.add(
                    Finding(
                        "HOST_PROCESS_RUNNING",
                        Status.OK,
                        f"{name} running (pid {', '.join(str(p.pid) for p in found[:5])})",
                        name,
                    )
                )
            else:
                b.add(
                    Finding(
                        "HOST_PROCESS_MISSING",
                        Status.CRITICAL,
                        f"required process {name} is not running",
                        name,
                        remedy=REMEDY_PROCESS,
                    )
                )

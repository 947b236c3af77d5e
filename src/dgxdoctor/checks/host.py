"""Host prerequisites: RAM and disk against the model's weights, free space, required processes.

By hand: ``free -b; df -B1 / /tmp/ray <model_dir>; du -cb <model_dir>/**/*.safetensors; pgrep -a raylet``.

The tutorial ("环境与前置条件"): system RAM >= 1.5x the weights (they pass through host memory while loading)
and disk >= 2x the weights. Both are prerequisites, not faults: a shortfall is a WARNING. A filesystem
below ``disk_critical_free_percent`` is CRITICAL: Ray and vLLM fail on a full /tmp or root. A required
process that is not running is CRITICAL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, ClassVar, Protocol

from msgspec import Meta, field

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge import host
from dgxdoctor.judge.host import DiskUsage, gib
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.procfs import iter_processes, parse_meminfo
from dgxdoctor.validation import ByteCount

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


class HostSettings(CheckSettings, frozen=True):
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 60.0
    model_dir: Annotated[
        Path | None,
        Meta(description="directory of the served model's weights (the same path on every node); unset: skipped"),
    ] = None
    weights_bytes: Annotated[
        ByteCount | None,
        Meta(
            description="size of the weights in bytes (or a size: 140G), instead of summing the files under model_dir"
        ),
    ] = None
    memory_ratio: Annotated[
        float, Meta(gt=0, le=100, description="system RAM must be at least this many times the weights")
    ] = 1.5
    disk_ratio: Annotated[
        float,
        Meta(
            gt=0,
            le=100,
            description="free space on the model's filesystem must be at least this many times the weights",
        ),
    ] = 2.0
    ray_log_dir: Annotated[Path, Meta(description="Ray's temp and log directory (ray start --temp-dir)")] = Path(
        "/tmp/ray"
    )
    root_path: Annotated[Path, Meta(description="the root filesystem's mount point")] = Path("/")
    extra_paths: Annotated[list[Path], Meta(description="more paths whose filesystem's free space is watched")] = field(
        default_factory=list
    )
    disk_warn_free_percent: Annotated[
        float, Meta(ge=0, le=100, description="warn when a watched filesystem has less than this percent free")
    ] = 10.0
    disk_critical_free_percent: Annotated[
        float, Meta(ge=0, le=100, description="critical when a watched filesystem has less than this percent free")
    ] = 3.0
    memory_available_warn_percent: Annotated[
        float, Meta(ge=0, le=100, description="warn when less than this percent of RAM is available")
    ] = 5.0
    required_processes: Annotated[
        list[str],
        Meta(
            description="processes that must be running, matched against process name and command line, e.g. "
            '["raylet", "vllm"]; a missing one is critical'
        ),
    ] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.disk_critical_free_percent > self.disk_warn_free_percent:
            raise ValueError("disk_critical_free_percent must not exceed disk_warn_free_percent")
        if any(not name.strip() for name in self.required_processes):
            raise ValueError("required_processes entries must not be empty")


class HostProbe(Protocol):
    """Memory, load and disk as the host check reads them; ``ProcProbe`` by default, a fake in tests. Processes are
    read from ``env.proc_root`` (sources.procfs)."""

    def memory(self) -> tuple[int, int]:
        """(total, available) bytes."""
        ...

    def swap_used(self) -> int | None: ...

    def load1_per_cpu(self) -> float | None: ...

    def disk_usage(self, path: Path) -> DiskUsage: ...


class ProcProbe:
    """``/proc/meminfo`` and statvfs(2): what psutil's ``virtual_memory``, ``swap_memory`` and ``disk_usage`` read
    on Linux, without psutil's modules in the daemon for good (``free -b``, ``df -B1`` show the same)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def _meminfo(self) -> dict[str, int]:
        return parse_meminfo((self.proc_root / "meminfo").read_text())

    def memory(self) -> tuple[int, int]:
        info = self._meminfo()
        # MemAvailable is the kernel's own estimate (since 3.14); before it, free plus page cache, as psutil does.
        available = info.get("MemAvailable")
        if available is None:
            available = info["MemFree"] + info.get("Buffers", 0) + info.get("Cached", 0)
        return info["MemTotal"], available

    def swap_used(self) -> int | None:
        try:
            info = self._meminfo()
            return info["SwapTotal"] - info["SwapFree"]
        except (OSError, KeyError):
            return None

    def load1_per_cpu(self) -> float | None:
        cpus = os.cpu_count() or 0
        if not cpus:
            return None
        return float(os.getloadavg()[0]) / cpus

    def disk_usage(self, path: Path) -> DiskUsage:
        st = os.statvfs(path)
        # Free as an unprivileged process sees it (f_bavail: the root-reserved blocks left out), as df and psutil.
        return DiskUsage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


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


class HostCheck(Check[HostSettings]):
    name: ClassVar[str] = "host"

    def __init__(self, settings: CheckSettings, env: Environment, probe: HostProbe | None = None) -> None:
        super().__init__(settings, env)
        self.probe: HostProbe = probe or ProcProbe()  # the real /proc, as psutil read it: memory is not a process

    def run(self) -> CheckResult:
        s = self.settings
        b = ResultBuilder(self.name)
        notes: list[str] = []

        total, available = self.probe.memory()
        b.sample(HOST_MEMORY_TOTAL, total)
        b.sample(HOST_MEMORY_AVAILABLE, available)
        b.sample(HOST_SWAP_USED, self.probe.swap_used())
        b.sample(HOST_LOAD1_PER_CPU, self.probe.load1_per_cpu())
        b.facts["host.memory_total_gib"] = str(round(total / 2**30))
        low = host.memory_available(total, available, s.memory_available_warn_percent)
        if low is not None:
            b.add(low)

        watched = [("/", s.root_path), ("ray_log_dir", s.ray_log_dir)] + [(str(p), p) for p in s.extra_paths]
        disks: list[str] = []
        for _kind, path in watched:
            usage = self.probe.disk_usage(existing_ancestor(path))
            disks.append(f"{path} {gib(usage.free)} free of {gib(usage.total)}")
            b.sample(HOST_FS_FREE, usage.free, path=str(path))
            b.sample(HOST_FS_SIZE, usage.total, path=str(path))
            finding = host.free_space(str(path), usage, s.disk_warn_free_percent, s.disk_critical_free_percent)
            if finding is not None:
                b.add(finding)

        self._weights(b, total, notes)
        self._processes(b)

        summary = host.summary(b.findings, f"RAM {gib(total)}, {gib(available)} available; disk {', '.join(disks)}")
        if notes:
            summary += " (" + "; ".join(notes) + ")"
        return b.build(summary)

    def _weights(self, b: ResultBuilder, memory_total: int, notes: list[str]) -> None:
        s = self.settings
        if s.model_dir is None and s.weights_bytes is None:
            notes.append("model_dir not configured: weights size not checked")
            return
        disk_free: int | None = None
        label = str(s.model_dir) if s.model_dir else "model"
        if s.model_dir is not None:
            if not s.model_dir.is_dir():
                b.add(host.model_dir_missing(str(s.model_dir), label))
                return
            usage = self.probe.disk_usage(s.model_dir)
            disk_free = usage.free
            b.sample(HOST_FS_FREE, usage.free, path=str(s.model_dir))
            b.sample(HOST_FS_SIZE, usage.total, path=str(s.model_dir))
        weights: int
        if s.weights_bytes is not None:
            weights = s.weights_bytes
        else:
            assert s.model_dir is not None
            weights, files = weights_size(s.model_dir)
            if files == 0:
                b.add(host.no_weights(str(s.model_dir), label))
                return
        b.sample(HOST_MODEL_WEIGHTS, weights)
        b.facts["host.model_weights_bytes"] = str(weights)
        b.add(*host.weights(weights, memory_total, disk_free, s.memory_ratio, s.disk_ratio, label))

    def _processes(self, b: ResultBuilder) -> None:
        wanted = self.settings.required_processes
        if not wanted:
            return
        me = os.getpid()
        # One listing for every name: each process's comm and cmdline are read once.
        running = [p for p in iter_processes(self.env.proc_root) if p.pid != me]
        for name in wanted:
            found = sorted((p for p in running if p.matches(name) and p.alive), key=lambda p: p.pid)
            b.sample(HOST_PROCESS_UP, 1 if found else 0, process=name)
            b.add(host.process(name, [p.pid for p in found]))

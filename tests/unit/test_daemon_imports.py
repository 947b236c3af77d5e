"""What `dgxdoctor run` loads: the daemon keeps every module it imports for its whole life, so one-shot code
(`diagnose` analyzers, the example-config and metrics-doc generators, the NCCL probe) and pynvml (until NVML is
used) stay out of it. See benchmarks/README.md for the memory this keeps off."""

from __future__ import annotations

import json

import pytest

from conftest import fresh_python

NOT_IN_DAEMON = (
    "dgxdoctor.diagnose.registry",
    "dgxdoctor.diagnose.base",
    "dgxdoctor.commands.config_doc",
    "dgxdoctor.exporters.metricsdoc",
    "dgxdoctor.probes.allreduce",
    "dgxdoctor.probes.vllm_cli",
    "dgxdoctor.judge.plan",
    "dgxdoctor.commands.plan_report",
    "dgxdoctor.sources.hf_model",
    "dgxdoctor.commands.bench",
    "dgxdoctor.commands.bench_report",
    "matplotlib",
    "difflib",
    "pynvml",
    # The host check reads /proc/meminfo and statvfs itself; nccl_env imports psutil for interface addresses only.
    "psutil",
    # The bundle code (and tarfile) loads with the first bundle request or capture before a restart.
    "dgxdoctor.bundle.build",
    "tarfile",
)


def test_daemon_imports_no_one_shot_code() -> None:
    code = (
        "import json, sys\n"
        "import dgxdoctor.cli, dgxdoctor.daemon.service\n"
        "from dgxdoctor.checks.registry import ALL_CHECKS\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = fresh_python(code)
    loaded = set(json.loads(out))
    assert "dgxdoctor.daemon.service" in loaded
    assert sorted(loaded.intersection(NOT_IN_DAEMON)) == []
    assert "apscheduler.schedulers.asyncio" in loaded  # the schedule's library, daemon-only (test_startup_imports)
    assert "aiohttp.web" in loaded  # the daemon's HTTP server


def test_structlog_loads_when_the_daemon_configures_its_log() -> None:
    """The daemon's event lines are structlog's; a module that logs imports only dgxdoctor.eventlog, so the one-shot
    commands (test_startup_imports) never load it."""
    code = (
        "import io, sys\n"
        "import dgxdoctor.cli, dgxdoctor.daemon.service\n"
        "from dgxdoctor.daemon import logconfig\n"
        "before = 'structlog' in sys.modules\n"
        "logconfig.configure('info', stream=io.StringIO())\n"
        "print(before, 'structlog' in sys.modules)\n"
    )
    assert fresh_python(code).split() == ["False", "True"]


def test_no_nvml_library_means_no_pynvml_import() -> None:
    code = (
        "import sys\n"
        "from dgxdoctor.sources.nvml import NvmlLibraryNotFound, PynvmlClient, nvml_library_loads\n"
        "if nvml_library_loads():\n"
        "    print('present')\n"
        "    raise SystemExit(0)\n"
        "try:\n"
        "    PynvmlClient().init()\n"
        "except NvmlLibraryNotFound as exc:\n"
        "    print(exc)\n"
        "print('pynvml' in sys.modules)\n"
    )
    out = fresh_python(code)
    if out.startswith("present"):
        pytest.skip("libnvidia-ml.so.1 loads on this machine: pynvml is rightly imported here")
    assert out.splitlines() == ["NVML library not found (libnvidia-ml.so.1 did not load)", "False"]


def test_malloc_arena_cap_defers_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from dgxdoctor.daemon.service import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


def test_release_freed_memory_freezes_start_up_objects() -> None:
    code = (
        "import gc, platform\n"
        "from dgxdoctor.daemon.memory import release_freed_memory\n"
        "trimmed = release_freed_memory(freeze=True)\n"
        "print(gc.get_freeze_count() > 0, trimmed == (platform.libc_ver()[0] == 'glibc'))\n"
    )
    out = fresh_python(code)
    assert out.split() == ["True", "True"]

"""Host check: RAM/disk against the weights, free space, required processes (a fake probe, real files, a proc
tree laid out in tmp_path)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from dgxdoctor.checks.host import HostCheck, HostSettings, existing_ancestor, weights_size
from dgxdoctor.environment import Environment
from dgxdoctor.judge.host import DiskUsage
from dgxdoctor.judge.host import free_space as evaluate_free_space
from dgxdoctor.judge.host import weights as evaluate_weights
from dgxdoctor.result import Status
from dgxdoctor.validation import validate
from proctree import write_process

GiB = 2**30


class FakeProbe:
    def __init__(
        self,
        total: int = 2048 * GiB,
        available: int = 1800 * GiB,
        disks: dict[str, DiskUsage] | None = None,
    ) -> None:
        self.total, self.available = total, available
        self.disks = disks or {}
        self.asked: list[Path] = []

    def memory(self) -> tuple[int, int]:
        return self.total, self.available

    def swap_used(self) -> int | None:
        return 0

    def load1_per_cpu(self) -> float | None:
        return None

    def disk_usage(self, path: Path) -> DiskUsage:
        self.asked.append(path)
        return self.disks.get(str(path), DiskUsage(1000 * GiB, 500 * GiB))


def run(tmp_path: Path, probe: FakeProbe, **settings: object) -> HostCheck:
    settings.setdefault("ray_log_dir", tmp_path / "ray")
    settings.setdefault("root_path", tmp_path)
    env = Environment(node="n1", state_dir=tmp_path, proc_root=tmp_path / "proc")
    return HostCheck(validate(HostSettings, settings), env, probe)  # type: ignore[arg-type]


def model_dir(tmp_path: Path, sizes: dict[str, int]) -> Path:
    root = tmp_path / "model"
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.truncate(size)  # sparse: the size is what counts
    return root


def test_weights_size_counts_weight_files_once(tmp_path: Path) -> None:
    root = model_dir(
        tmp_path,
        {
            "model-00001-of-00002.safetensors": 5000,
            "model-00002-of-00002.safetensors": 3000,
            "sub/consolidated.pt": 700,
            "q.gguf": 11,
            "pytorch_model.bin": 200,
            "config.json": 999_999,
            "tokenizer.model": 999_999,
        },
    )
    # Hugging Face cache layout: snapshot files are links to blobs; a second link to the same blob counts once.
    os.symlink(root / "model-00001-of-00002.safetensors", root / "sub" / "again.safetensors")
    os.symlink(root / "missing.bin", root / "dangling.bin")
    assert weights_size(root) == (5000 + 3000 + 700 + 11 + 200, 5)


def test_existing_ancestor(tmp_path: Path) -> None:
    assert existing_ancestor(tmp_path / "ray" / "session_latest") == tmp_path
    assert existing_ancestor(tmp_path) == tmp_path


@pytest.mark.parametrize(
    ("free", "expected"),
    [(500, None), (101, None), (99, Status.WARNING), (31, Status.WARNING), (29, Status.CRITICAL), (0, Status.CRITICAL)],
)
def test_free_space_thresholds(free: int, expected: Status | None) -> None:
    finding = evaluate_free_space("/tmp/ray", DiskUsage(1000, free), warn_percent=10, critical_percent=3)
    assert (finding.status if finding else None) == expected
    if finding:
        assert finding.code == "HOST_DISK_LOW" and finding.subject == "/tmp/ray"


def test_weights_rules_of_the_tutorial() -> None:
    weights = 800 * GiB
    ok = evaluate_weights(weights, 1200 * GiB, 1600 * GiB, 1.5, 2.0, "/models/m")
    assert ok == []
    bad = evaluate_weights(weights, 1199 * GiB, 1599 * GiB, 1.5, 2.0, "/models/m")
    assert [(f.code, f.status) for f in bad] == [
        ("HOST_MEMORY_BELOW_WEIGHTS", Status.WARNING),
        ("HOST_DISK_BELOW_WEIGHTS", Status.WARNING),
    ]
    assert bad[0].message == "system RAM 1199.0 GiB is below 1.5x the weights (800.0 GiB)"
    assert evaluate_weights(weights, 1199 * GiB, None, 1.5, 2.0, "model")[0].code == "HOST_MEMORY_BELOW_WEIGHTS"


def test_check_without_model_dir_notes_it(tmp_path: Path) -> None:
    result = run(tmp_path, FakeProbe()).run()
    assert result.status is Status.OK
    assert result.summary == (
        f"RAM 2048.0 GiB, 1800.0 GiB available; disk {tmp_path} 500.0 GiB free of 1000.0 GiB, "
        f"{tmp_path / 'ray'} 500.0 GiB free of 1000.0 GiB (model_dir not configured: weights size not checked)"
    )
    names = {(s.metric.name, tuple(s.labels.items())) for s in result.samples}
    assert ("dgxdoctor_host_memory_total_bytes", ()) in names
    assert ("dgxdoctor_host_filesystem_free_bytes", (("path", str(tmp_path / "ray")),)) in names
    assert ("dgxdoctor_host_filesystem_free_bytes", (("path", str(tmp_path)),)) in names
    assert not any(s.metric.name == "dgxdoctor_host_model_weights_bytes" for s in result.samples)
    assert not any(s.metric.name == "dgxdoctor_host_load1_per_cpu" for s in result.samples)  # None: absent


def test_check_weights_against_memory_and_disk(tmp_path: Path) -> None:
    root = model_dir(tmp_path, {"a.safetensors": 100 * GiB, "b.safetensors": 100 * GiB})
    probe = FakeProbe(total=256 * GiB, available=200 * GiB, disks={str(root): DiskUsage(1000 * GiB, 300 * GiB)})
    result = run(tmp_path, probe, model_dir=root).run()
    assert result.status is Status.WARNING
    assert [f.code for f in result.findings] == ["HOST_MEMORY_BELOW_WEIGHTS", "HOST_DISK_BELOW_WEIGHTS"]
    weights = [s.value for s in result.samples if s.metric.name == "dgxdoctor_host_model_weights_bytes"]
    assert weights == [200.0 * GiB]
    assert result.facts["host.model_weights_bytes"] == str(200 * GiB)
    assert result.action is not None and result.action.kind == "investigate"


def test_weights_override(tmp_path: Path) -> None:
    result = run(tmp_path, FakeProbe(total=100 * GiB, available=90 * GiB), weights_bytes=80 * GiB).run()
    assert [f.code for f in result.findings] == ["HOST_MEMORY_BELOW_WEIGHTS"]


def test_missing_model_dir_is_critical(tmp_path: Path) -> None:
    result = run(tmp_path, FakeProbe(), model_dir=tmp_path / "nowhere").run()
    assert [(f.code, f.status) for f in result.findings] == [("HOST_MODEL_DIR_MISSING", Status.CRITICAL)]


def test_model_dir_without_weights_is_warning(tmp_path: Path) -> None:
    root = model_dir(tmp_path, {"config.json": 10})
    result = run(tmp_path, FakeProbe(), model_dir=root).run()
    assert [(f.code, f.status) for f in result.findings] == [("HOST_MODEL_NO_WEIGHTS", Status.WARNING)]


def test_full_ray_dir_is_critical(tmp_path: Path) -> None:
    probe = FakeProbe(disks={str(tmp_path): DiskUsage(1000 * GiB, 10 * GiB)})
    result = run(tmp_path, probe).run()  # root and /tmp/ray both live on tmp_path here
    assert result.status is Status.CRITICAL
    assert [f.subject for f in result.findings] == [str(tmp_path), str(tmp_path / "ray")]
    assert probe.asked == [tmp_path, tmp_path]


def test_low_available_memory_is_warning(tmp_path: Path) -> None:
    result = run(tmp_path, FakeProbe(total=1000 * GiB, available=20 * GiB)).run()
    assert [f.code for f in result.findings] == ["HOST_MEMORY_LOW_AVAILABLE"]


def test_required_processes(tmp_path: Path) -> None:
    write_process(tmp_path / "proc", 42, "raylet", ["/x/raylet"])
    write_process(tmp_path / "proc", 43, "raylet", ["/x/raylet"], state="Z")  # a zombie is not running
    write_process(tmp_path / "proc", os.getpid(), "python3", ["python3", "-m", "vllm"])
    result = run(tmp_path, FakeProbe(), required_processes=["raylet", "vllm"]).run()
    assert result.status is Status.CRITICAL
    assert [(f.code, f.subject) for f in result.findings] == [
        ("HOST_PROCESS_RUNNING", "raylet"),
        ("HOST_PROCESS_MISSING", "vllm"),  # our own process never counts
    ]
    assert result.findings[0].message == "raylet running (pid 42)"
    up = {s.labels["process"]: s.value for s in result.samples if s.metric.name == "dgxdoctor_host_process_up"}
    assert up == {"raylet": 1.0, "vllm": 0.0}


def test_settings_are_validated() -> None:
    with pytest.raises(msgspec.ValidationError, match="disk_critical_free_percent must not exceed"):
        validate(HostSettings, {"disk_warn_free_percent": 5, "disk_critical_free_percent": 10})
    with pytest.raises(msgspec.ValidationError, match="must not be empty"):
        validate(HostSettings, {"required_processes": [" "]})


def test_real_psutil_probe_runs(tmp_path: Path) -> None:
    check = HostCheck(HostSettings(ray_log_dir=tmp_path / "ray", root_path=tmp_path), Environment(state_dir=tmp_path))
    result = check.run()
    assert result.status in (Status.OK, Status.WARNING, Status.CRITICAL)
    assert any(s.metric.name == "dgxdoctor_host_memory_total_bytes" and s.value > 0 for s in result.samples)


# /proc/meminfo of the CPU test machine (Debian 12, kernel 6.18), first lines and the swap lines, 2026-12-01.
MEMINFO = """MemTotal:       24683584 kB
MemFree:        18738304 kB
MemAvailable:   21250108 kB
Buffers:          115280 kB
Cached:          2222836 kB
SwapTotal:       2097148 kB
SwapFree:        1048572 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def test_proc_probe_reads_meminfo_in_bytes(tmp_path: Path) -> None:
    from dgxdoctor.checks.host import ProcProbe

    (tmp_path / "meminfo").write_text(MEMINFO)
    probe = ProcProbe(tmp_path)
    assert probe.memory() == (24683584 * 1024, 21250108 * 1024)
    assert probe.swap_used() == (2097148 - 1048572) * 1024
    (tmp_path / "meminfo").write_text(MEMINFO.replace("MemAvailable:   21250108 kB\n", ""))
    assert probe.memory()[1] == (18738304 + 115280 + 2222836) * 1024  # a kernel before 3.14


def test_proc_probe_agrees_with_psutil_here() -> None:
    import psutil

    from dgxdoctor.checks.host import ProcProbe

    probe = ProcProbe()
    total, available = probe.memory()
    assert total == psutil.virtual_memory().total
    assert abs(available - psutil.virtual_memory().available) < 0.05 * total
    disk = probe.disk_usage(Path("/"))
    assert disk.total == psutil.disk_usage("/").total
    assert abs(disk.free - psutil.disk_usage("/").free) < 2**30

"""Small test-only checks that exercise the daemon through the generic check protocol (not shipped)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder, Status

# Names from the brief's metric contract, so the peer comparison and the exporter see realistic families.
GPU_MEM_USED = MetricSpec("dgxdoctor_gpu_memory_used_bytes", "GPU memory in use", labels=("gpu", "pci_bus_id"))
GPU_UTIL = MetricSpec("dgxdoctor_gpu_utilization_ratio", "GPU utilisation 0..1", labels=("gpu", "pci_bus_id"))
IB_ERRORS = MetricSpec(
    "dgxdoctor_ib_port_errors_per_second", "IB port errors per second", labels=("device", "port", "counter")
)
XID_TOTAL = MetricSpec("dgxdoctor_xid_errors_total", "XID errors seen", "counter", ("pci_bus_id", "xid"))
FAKE_INFO = MetricSpec("dgxdoctor_fake_build_info", "a fake info family", "info", ("model",))


class FakeSettings(CheckSettings):
    interval_s: float = 0.05
    timeout_s: float = 5.0


class StaticCheck(Check):
    """Returns whatever ``outcome`` holds (a CheckResult or an exception to raise); counts its runs."""

    name: ClassVar[str] = "static"
    settings_model: ClassVar[type[CheckSettings]] = FakeSettings

    def __init__(self, settings: CheckSettings, env: Environment, outcome: Any = None, name: str | None = None):
        self.settings: CheckSettings = settings
        self.env = env
        self.outcome = outcome
        if name is not None:
            self.name = name  # type: ignore[misc]
        self.runs = 0
        self.ran = threading.Event()

    def run(self) -> CheckResult:
        self.runs += 1
        self.ran.set()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        if self.outcome is None:
            return CheckResult(self.name, Status.OK, "fine")
        assert isinstance(self.outcome, CheckResult)
        return self.outcome


class SlowCheck(Check):
    """Blocks until released; records how many runs overlapped."""

    name: ClassVar[str] = "slow"
    settings_model: ClassVar[type[CheckSettings]] = FakeSettings

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        self.settings: CheckSettings = settings
        self.release = threading.Event()
        self.started = threading.Event()
        self.active = 0
        self.max_active = 0
        self.runs = 0
        self._lock = threading.Lock()

    def run(self) -> CheckResult:
        with self._lock:
            self.active += 1
            self.runs += 1
            self.max_active = max(self.max_active, self.active)
        self.started.set()
        self.release.wait(10)
        with self._lock:
            self.active -= 1
        return CheckResult(self.name, Status.OK, "done")


class FollowingCheck(Check):
    """An event source: start() / stop() are called by the scheduler (through the runner)."""

    name: ClassVar[str] = "following"
    settings_model: ClassVar[type[CheckSettings]] = FakeSettings

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        self.settings: CheckSettings = settings
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopped = False
        self.runs = 0

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()

    def stop(self) -> None:
        self.stopped = True

    def run(self) -> CheckResult:
        self.runs += 1
        return CheckResult(self.name, Status.OK, f"following: run {self.runs}")


def gpu_result(check: str = "gpu", util: float = 0.9, mem_gib: float = 60.0, driver: str = "580.159.04") -> CheckResult:
    b = ResultBuilder(check)
    for i in range(2):
        labels = {"gpu": str(i), "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0"}
        b.sample(GPU_MEM_USED, mem_gib * 2**30, **labels)
        b.sample(GPU_UTIL, util, **labels)
    b.facts["driver_version"] = driver
    b.facts["gpu_count"] = "2"
    return b.build("2 GPUs healthy")

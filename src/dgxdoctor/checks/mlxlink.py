"""Module temperature and effective (post-FEC) BER per RDMA port, from NVIDIA MFT's ``mlxlink``, when installed.

By hand: ``mlxlink -d mlx5_0 -p 1 -m -c``. Optional: without mlxlink the check is SKIPPED with that reason (the
infiniband check reads everything sysfs has). Ports come from ``<sysfs_root>/class/infiniband``; each port is one
argv through the command runner. Verdicts: judge/infiniband.py.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.judge.infiniband import (
    EFFECTIVE_BER_LIMIT,
    MODULE_TEMP_CRIT_C,
    MODULE_TEMP_WARN_C,
    effective_ber_verdict,
    module_temperature_verdict,
)
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S, HOUR_S
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.mlxlink import MlxlinkFormatError, parse_mlxlink
from dgxdoctor.sources.sysfs_ib import IbPort, read_ports

MODULE_TEMPERATURE = MetricSpec(
    "dgxdoctor_ib_module_temperature_celsius",
    "Temperature of the port's cable module (transceiver), degrees Celsius, from mlxlink",
    labels=("device", "port"),
)
EFFECTIVE_BER = MetricSpec(
    "dgxdoctor_ib_port_effective_ber",
    "Effective (post-FEC) physical bit error ratio of the port, from mlxlink",
    labels=("device", "port"),
)


class MlxlinkSettings(CheckSettings, frozen=True):
    interval_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs (one mlxlink call per port)")
    ] = 300.0
    timeout_s: Annotated[float, Meta(gt=0, le=DAY_S, description="a run that takes longer is UNKNOWN")] = 120.0
    command_timeout_s: Annotated[float, Meta(gt=0, le=HOUR_S, description="seconds one mlxlink call may take")] = 15.0
    module_temp_warn_c: Annotated[
        float, Meta(ge=0, le=150, description="module temperature above this is a warning")
    ] = MODULE_TEMP_WARN_C
    module_temp_crit_c: Annotated[
        float, Meta(ge=0, le=150, description="module temperature above this is critical")
    ] = MODULE_TEMP_CRIT_C
    effective_ber_limit: Annotated[float, Meta(gt=0, le=1, description="effective BER above this: warning")] = (
        EFFECTIVE_BER_LIMIT
    )


class MlxlinkCheck(Check[MlxlinkSettings]):
    name: ClassVar[str] = "mlxlink"
    probes: ClassVar[tuple[str, ...]] = ("mlxlink",)

    def run(self) -> CheckResult:
        ports = [p for p in read_ports(self.env.sysfs_root, counters=False) if p.device.startswith("mlx5_")]
        if not ports:
            return CheckResult.skipped(self.name, "no mlx5 RDMA port in sysfs")
        b = ResultBuilder(self.name)
        for port in ports:
            try:
                done = self.env.run_command(self._argv(port), self.settings.command_timeout_s)
            except CommandNotFound:
                return CheckResult.skipped(
                    self.name, "mlxlink not installed (NVIDIA MFT): module temperature and effective BER not read"
                )
            except CommandTimeout as exc:
                b.timed_out("mlxlink")
                b.add(Finding("IB_MLXLINK_TIMEOUT", Status.UNKNOWN, f"{port.name}: {exc}", port.name))
                continue
            self._judge(b, port, done.returncode, done.stdout, done.stderr)
        bad = [f for f in b.findings if f.status is not Status.OK]
        summary = f"{len(ports)} port(s) read with mlxlink" + (
            ": " + "; ".join(f.message for f in bad[:3]) if bad else ""
        )
        return b.build(summary)

    @staticmethod
    def _argv(port: IbPort) -> list[str]:
        return ["mlxlink", "-d", port.device, "-p", str(port.port), "-m", "-c"]

    def _judge(self, b: ResultBuilder, port: IbPort, rc: int, out: str, err: str) -> None:
        labels = {"device": port.device, "port": str(port.port)}
        try:
            if rc != 0:
                raise MlxlinkFormatError(f"mlxlink exited {rc}: {(err or out).strip()[:160]}")
            read = parse_mlxlink(out)
        except MlxlinkFormatError as exc:
            b.add(Finding("IB_MLXLINK_UNREADABLE", Status.UNKNOWN, f"{port.name}: {exc}", port.name))
            return
        b.sample(MODULE_TEMPERATURE, read.module_temperature_c, **labels)
        b.sample(EFFECTIVE_BER, read.effective_ber, **labels)
        c = self.settings
        verdicts = [
            module_temperature_verdict(port.name, read.module_temperature_c, c.module_temp_warn_c, c.module_temp_crit_c)
            if read.module_temperature_c is not None else None,
            effective_ber_verdict(port.name, read.effective_ber, c.effective_ber_limit)
            if read.effective_ber is not None else None,
        ]  # fmt: skip
        for v in verdicts:
            if v is not None:
                b.add(v.finding(port.name))

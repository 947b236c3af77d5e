"""InfiniBand / RoCE ports: link state, negotiated rate, link layer, error counters and their rates, flaps.

By hand::

    grep -r . /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}
    grep -r . /sys/class/infiniband/mlx5_0/ports/1/counters/ /sys/class/infiniband/mlx5_0/ports/1/hw_counters/
    ibstat; ibdev2netdev

Thresholds (defaults in ``DEFAULT_THRESHOLDS``) follow NVIDIA's NIC health monitor ("NVSentinel"), the most
complete public reference: https://docs.nvidia.com/nvsentinel/components/nic-health-monitor/link-counter-detection
and its configuration reference (docs/configuration/nic-health-monitor.md in github.com/NVIDIA/NVSentinel).
There, any increase of ``link_downed``, ``excessive_buffer_overrun_errors``, ``local_link_integrity_errors`` or
``rnr_nak_retry_err`` is fatal, ``symbol_error`` above 120 per hour violates the IBTA BER budget of 1e-12
(fatal), and rates of ``symbol_error`` (10/s), ``link_error_recovery`` (5/min), ``port_rcv_errors`` (10/s),
``local_ack_timeout_err`` (1/s), ``port_xmit_discards`` (100/s) and ``roce_slow_restart`` (10/s) mark
degradation.

Rates come from deltas over real elapsed time between runs. The last values live in a small state file
(``<state_dir>/infiniband.json``, written atomically) so a restart of dgxdoctor loses no baseline; a different
boot id, a clock that went backwards, or a counter that went down (a reset: ``perfquery -R``, a driver reload)
starts a new baseline instead of producing a bogus negative rate.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta, field

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.checks.ib_history import CounterHistory
from dgxdoctor.environment import Environment
from dgxdoctor.judge.infiniband import (
    DEFAULT_THRESHOLDS,
    ERROR_COUNTERS,
    CounterThreshold,
    Verdict,
    counter_verdicts,
    counters_unavailable,
    flap_verdict,
    node_verdicts,
    port_verdicts,
    ports_missing,
    saturated_counters,
    saturation_verdict,
)
from dgxdoctor.judge.presence import rdma_absent
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import WEEK_S
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout
from dgxdoctor.sources.ibstat import parse_ibstat
from dgxdoctor.sources.pci import mellanox_nics, read_pci_devices
from dgxdoctor.sources.statefile import boot_id
from dgxdoctor.sources.sysfs_ib import DATA_WORD_BYTES, IbPort, ib_class_dir, read_device_info, read_ports

IBSTAT_TIMEOUT_S = 10.0
IBSTAT_HUNG_REMEDY = (
    "ibstat hangs when the RDMA driver or a port's MAD layer is stuck: `dmesg | grep -i mlx5`, `rdma link`; "
    "restarting openibd (or rebooting) clears it"
)


# Metrics (metric name contract: IB labels {device, port} and {device, port, counter}).
PORT_RATE = MetricSpec(
    "dgxdoctor_ib_port_rate_gbps", "Negotiated link rate of the RDMA port in Gb/s.", labels=("device", "port")
)
PORT_UP = MetricSpec(
    "dgxdoctor_ib_port_up",
    "1 when the RDMA port is Active with physical state LinkUp, 0 otherwise.",
    labels=("device", "port"),
)
PORT_RCV_BPS = MetricSpec(
    "dgxdoctor_ib_port_rcv_bytes_per_second",
    "Bytes received per second on the RDMA port between the last two runs (port_rcv_data x 4).",
    labels=("device", "port"),
)
PORT_XMIT_BPS = MetricSpec(
    "dgxdoctor_ib_port_xmit_bytes_per_second",
    "Bytes transmitted per second on the RDMA port between the last two runs (port_xmit_data x 4).",
    labels=("device", "port"),
)
# The port's counter files in base units, as node_exporter's infiniband collector exports them: the data counters
# count 4-byte words (port_rcv_data x 4 = bytes) and get byte families of their own; every other file (packets,
# errors, waits, hw_counters/) is one family labelled with the file's name. A counter's name never says "counter"
# and a byte count ends in _bytes_total (promtool check metrics).
PORT_RCV_BYTES = MetricSpec(
    "dgxdoctor_ib_port_rcv_bytes_total",
    "Bytes received on the RDMA port since the counter was last reset (counters/port_rcv_data x 4).",
    type="counter",
    labels=("device", "port"),
)
PORT_XMIT_BYTES = MetricSpec(
    "dgxdoctor_ib_port_xmit_bytes_total",
    "Bytes transmitted on the RDMA port since the counter was last reset (counters/port_xmit_data x 4).",
    type="counter",
    labels=("device", "port"),
)
PORT_EVENTS = MetricSpec(
    "dgxdoctor_ib_port_events_total",
    "Value of one of the RDMA port's other counter files (counters/ or hw_counters/, named by the counter label): "
    "packets, errors, wait ticks.",
    type="counter",
    labels=("device", "port", "counter"),
)
DATA_BYTES = {"port_rcv_data": PORT_RCV_BYTES, "port_xmit_data": PORT_XMIT_BYTES}
PORT_ERRORS_PER_SECOND = MetricSpec(
    "dgxdoctor_ib_port_errors_per_second",
    "Increase per second of an RDMA port error counter between the last two runs.",
    labels=("device", "port", "counter"),
)
PORT_FLAPS = MetricSpec(
    "dgxdoctor_ib_port_link_flaps",
    "Link flaps (link_downed increases) of the RDMA port within the configured flap window.",
    labels=("device", "port"),
)
DEVICE_INFO = MetricSpec(
    "dgxdoctor_ib_device_info",
    "RDMA device facts from sysfs: firmware version (fw_ver), HCA type and board id; value 1.",
    type="info",
    labels=("device", "fw_ver", "hca_type", "board_id"),
)
PORT_INFO = MetricSpec(
    "dgxdoctor_ib_port_info",
    "RDMA port facts: link layer, logical and physical state, network interface; value 1.",
    type="info",
    labels=("device", "port", "link_layer", "state", "phys_state", "netdev"),
)


class InfinibandSettings(CheckSettings, frozen=True):
    expected_ports: Annotated[
        Annotated[int, Meta(ge=0, le=256)] | None,
        Meta(description="number of RDMA ports this node must have (after include/exclude); unset: no check"),
    ] = None
    min_rate_gbps: Annotated[
        Annotated[float, Meta(gt=0, le=10000)] | None,
        Meta(description="lowest acceptable negotiated rate per port in Gb/s, e.g. 400 for NDR; unset: no check"),
    ] = None
    link_layer: Annotated[
        Literal["InfiniBand", "Ethernet", "any"],
        Meta(description="link layer every port must have: InfiniBand, Ethernet (RoCE) or any"),
    ] = "any"
    devices_include: Annotated[
        list[str], Meta(description="only these devices or ports (glob patterns on 'mlx5_0' or 'mlx5_0/1'); empty: all")
    ] = field(default_factory=list)
    devices_exclude: Annotated[
        list[str], Meta(description="skip these devices or ports (glob patterns), e.g. storage or management NICs")
    ] = field(default_factory=list)
    thresholds: Annotated[
        dict[str, CounterThreshold],
        Meta(
            description="counter rules by name (defaults: NVIDIA's NIC health monitor); a rule named here replaces "
            "the built-in rule of that name, rules not named keep their defaults. Keys of a rule: counter (default "
            "the rule name), kind ('increase' since the last run, or 'rate'), limit, per (second/minute/hour), "
            "severity (warning/critical), enabled"
        ),
    ] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    flap_window_s: Annotated[
        float, Meta(gt=0, le=WEEK_S, description="how far back link flaps are remembered, seconds")
    ] = 86400.0
    flap_warn_count: Annotated[
        int, Meta(ge=1, le=10000, description="this many flaps of one port within the window is a warning")
    ] = 2
    use_ibstat: Annotated[bool, Meta(description="fall back to `ibstat` when sysfs shows no RDMA device")] = True


class InfinibandCheck(Check[InfinibandSettings]):
    """RDMA ports (InfiniBand and RoCE). Same data by hand: ``grep -r . /sys/class/infiniband/*/ports/*/`` or
    ``ibstat``; counters via ``perfquery -x``. Reads through ``sources/sysfs_ib.py`` (or ``ibstat``), remembers in
    ``ib_history.py``, judges in ``judge/infiniband.py``."""

    name: ClassVar[str] = "infiniband"
    probes: ClassVar[tuple[str, ...]] = ("ibstat",)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self.rules: dict[str, CounterThreshold] = {**DEFAULT_THRESHOLDS, **self.settings.thresholds}
        self._history = CounterHistory(env.state_dir, self.rules, self.settings.flap_window_s)

    # -- reading --------------------------------------------------------------------------------------------

    def _read(self) -> tuple[list[IbPort], str] | str:
        """(ports, source) or the reason to skip."""
        class_dir = ib_class_dir(self.env.sysfs_root)
        ports = read_ports(self.env.sysfs_root)
        if ports:
            return ports, "sysfs"
        where = f"{class_dir} has no RDMA ports" if class_dir.is_dir() else f"no {class_dir}"
        if not self.settings.use_ibstat:
            return where
        try:
            done = self.env.run_command(["ibstat"], IBSTAT_TIMEOUT_S)
        except CommandNotFound:
            return f"{where} and no ibstat: no RDMA device here"
        if done.returncode != 0:
            raise RuntimeError(f"ibstat exited {done.returncode}: {done.stderr.strip()[:200]}")
        parsed = parse_ibstat(done.stdout)
        if not parsed:
            return f"{where} and ibstat lists no device"
        return [p.to_ib_port() for p in parsed], "ibstat"

    def _selected(self, port: IbPort) -> bool:
        names = (port.device, port.name)
        inc, exc = self.settings.devices_include, self.settings.devices_exclude
        if inc and not any(fnmatch.fnmatchcase(n, pat) for n in names for pat in inc):
            return False
        return not any(fnmatch.fnmatchcase(n, pat) for n in names for pat in exc)

    # -- run -------------------------------------------------------------------------------------------------

    def _absent(self, reason: str) -> CheckResult:
        """No RDMA device: fine only when no Mellanox NIC is on the PCI bus and no role needs the ports."""
        devices = read_pci_devices(self.env.sysfs_root)
        nics = mellanox_nics(devices) if devices is not None else []
        finding = rdma_absent(nics, self.env.role, self.settings.expected_ports)
        if finding is None:
            return CheckResult.skipped(self.name, f"{reason}; no Mellanox NIC on the PCI bus")
        b = ResultBuilder(self.name)
        b.add(finding)
        return b.build(f"{reason}: {finding.message}")

    def run(self) -> CheckResult:
        try:
            read = self._read()
        except CommandTimeout as exc:
            b = ResultBuilder(self.name)
            b.timed_out("ibstat")
            b.add(Finding("IB_IBSTAT_TIMEOUT", Status.UNKNOWN, f"ibstat timed out: {exc}", remedy=IBSTAT_HUNG_REMEDY))
            return b.build(f"no RDMA port in sysfs and ibstat timed out ({IBSTAT_TIMEOUT_S:g} s)")
        if isinstance(read, str):
            return self._absent(read)
        all_ports, source = read
        ports = [p for p in all_ports if self._selected(p)]
        s = self.settings
        if not ports and not s.expected_ports:
            return CheckResult.skipped(
                self.name, f"{len(all_ports)} RDMA port(s) found, none selected by devices_include/exclude"
            )
        b = ResultBuilder(self.name)
        now = self.env.clock()
        entries = self._history.load(boot_id(self.env.proc_root))
        verdicts = ports_missing(len(ports), s.expected_ports)
        for port in ports:
            _export_port(b, port)
            verdicts += port_verdicts(port, s.min_rate_gbps, s.link_layer)
            saturated = saturation_verdict(port.name, saturated_counters(port.counters))
            if saturated is not None:
                verdicts.append((saturated.finding(port.name), f"{port.name} counters saturated"))
            entry = entries.get(port.name)
            entries[port.name] = self._counters(b, port, entry if isinstance(entry, dict) else {}, now, verdicts)
        self._history.save({p.name for p in ports}, now, boot_id(self.env.proc_root))
        verdicts += self._node_verdicts(b, ports) if source == "sysfs" else _ibstat_node_verdicts(ports)
        b.add(*(f for f, _ in verdicts))  # in the order found: missing ports, port by port, then the node's
        return b.build(_summary(b, ports, source, [why for _, why in verdicts if why]))

    def _node_verdicts(self, b: ResultBuilder, ports: list[IbPort]) -> list[Verdict]:
        """Rates across the Active rails, firmware across the HCAs of one type (sysfs ``fw_ver``, ``hca_type``)."""
        infos = read_device_info(self.env.sysfs_root)
        devices = sorted({p.device for p in ports})
        for dev in devices:
            info = infos.get(dev)
            if info is not None:
                b.sample(DEVICE_INFO, 1.0, device=dev, fw_ver=info.fw_ver or "", hca_type=info.hca_type or "",
                         board_id=info.board_id or "")  # fmt: skip
        rates = {p.name: p.rate_gbps for p in ports if p.active and p.rate_gbps is not None}
        firmware = {d: (infos[d].hca_type, infos[d].fw_ver or "") for d in devices if d in infos and infos[d].fw_ver}
        return node_verdicts(rates, firmware)

    def _counters(
        self, b: ResultBuilder, port: IbPort, entry: Mapping[str, Any], now: float, verdicts: list[Verdict]
    ) -> dict[str, Any]:
        """Samples and verdicts from the port's counters; returns the port's new state entry."""
        labels = {"device": port.device, "port": str(port.port)}
        unavailable = counters_unavailable(port)
        if unavailable is not None:  # the summary says it: a port not watched must not read as a plain OK
            verdicts.append((unavailable, f"{port.name} counters {'partly ' if port.counters else ''}unavailable"))
        if not port.counters:
            flaps = self._history.recent_flaps(entry.get("flaps"), now)
            b.sample(PORT_FLAPS, float(len(flaps)), **labels)
            return {"flaps": flaps}
        for name, value in sorted(port.counters.items()):
            in_bytes = DATA_BYTES.get(name)
            if in_bytes is not None:
                b.sample(in_bytes, float(value * DATA_WORD_BYTES), **labels)
            else:
                b.sample(PORT_EVENTS, float(value), counter=name, **labels)
        win = self._history.window(entry, port.counters, now)
        elapsed = win.elapsed
        if elapsed is not None:
            for data, metric in (("port_rcv_data", PORT_RCV_BPS), ("port_xmit_data", PORT_XMIT_BPS)):
                if data in win.deltas:
                    b.sample(metric, win.deltas[data] * DATA_WORD_BYTES / elapsed, **labels)
            for name, delta in sorted(win.deltas.items()):
                if name in ERROR_COUNTERS or any((r.counter or n) == name for n, r in self.rules.items()):
                    b.sample(PORT_ERRORS_PER_SECOND, delta / elapsed, counter=name, **labels)
        b.sample(PORT_FLAPS, float(len(win.flaps)), **labels)
        verdicts += flap_verdict(port.name, len(win.flaps), self.settings.flap_warn_count, self.settings.flap_window_s)
        if win.prev is not None:
            verdicts += counter_verdicts(
                port.name, self.rules, win.counters, win.deltas, win.prev, win.checkpoints, now
            )
        return self._history.entry(win)


def _saturation(port: IbPort) -> list[Verdict]:
    found = saturation_verdict(port.name, saturated_counters(port.counters))
    if found is None:
        return []
    return [(found.finding(port.name), f"{port.name} counters saturated")]


def _ibstat_node_verdicts(ports: list[IbPort]) -> list[Verdict]:
    """ibstat gives no firmware per port here: only the rates."""
    return node_verdicts({p.name: p.rate_gbps for p in ports if p.active and p.rate_gbps is not None}, {})


def _export_port(b: ResultBuilder, port: IbPort) -> None:
    labels = {"device": port.device, "port": str(port.port)}
    # The rate file of a port without link shows a meaningless minimum (often 10 Gb/s): export Active only.
    b.sample(PORT_RATE, port.rate_gbps if port.active else None, **labels)
    if port.state is not None:
        b.sample(PORT_UP, 1.0 if port.active and port.phys_state in (None, "LinkUp") else 0.0, **labels)
    b.sample(
        PORT_INFO,
        1.0,
        **labels,
        link_layer=port.link_layer or "",
        state=port.state or "",
        phys_state=port.phys_state or "",
        netdev=port.netdev or "",
    )


def _summary(b: ResultBuilder, ports: list[IbPort], source: str, problems: list[str]) -> str:
    active = [p for p in ports if p.active]
    rates = sorted({p.rate_gbps for p in active if p.rate_gbps is not None})
    b.facts["ib_port_count"] = str(len(ports))
    b.facts["ib_active_port_count"] = str(len(active))
    b.facts["ib_port_rates_gbps"] = ",".join(f"{r:g}" for r in rates)
    b.facts["ib_link_layers"] = ",".join(sorted({p.link_layer for p in ports if p.link_layer}))
    desc = f"{len(active)}/{len(ports)} RDMA port(s) Active"
    if rates:
        desc += f" at {'/'.join(f'{r:g}' for r in rates)} Gb/s"
    if source != "sysfs":
        desc += f" (from {source}: no counters)"
    summary = desc if not problems else f"{desc}; " + "; ".join(problems[:4])
    if len(problems) > 4:
        summary += f"; +{len(problems) - 4} more"
    return summary

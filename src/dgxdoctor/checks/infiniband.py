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
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.infiniband import (
    DEFAULT_THRESHOLDS,
    ERROR_COUNTERS,
    PER_SECONDS,
    REMEDIES,
    CounterThreshold,
    duration_text,
    port_rate_verdict,
    port_state_verdict,
    rate_breach,
)
from dgxdoctor.judge.presence import rdma_absent
from dgxdoctor.result import CheckResult, MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.commands import CommandNotFound
from dgxdoctor.sources.ibstat import parse_ibstat
from dgxdoctor.sources.pci import mellanox_nics, read_pci_devices
from dgxdoctor.sources.statefile import StateFile, boot_id
from dgxdoctor.sources.sysfs_ib import DATA_WORD_BYTES, IbPort, ib_class_dir, read_ports

STATE_FILE_NAME = "infiniband.json"
STATE_VERSION = 1
IBSTAT_TIMEOUT_S = 10.0


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
PORT_COUNTER = MetricSpec(
    "dgxdoctor_ib_port_counter_total",
    "Raw value of a port counter from counters/ or hw_counters/ (port_*_data in 4-byte words).",
    type="counter",
    labels=("device", "port", "counter"),
)
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
PORT_INFO = MetricSpec(
    "dgxdoctor_ib_port_info",
    "RDMA port facts: link layer, logical and physical state, network interface; value 1.",
    type="info",
    labels=("device", "port", "link_layer", "state", "phys_state", "netdev"),
)


class InfinibandSettings(CheckSettings):
    expected_ports: int | None = Field(
        None, ge=0, description="number of RDMA ports this node must have (after include/exclude); unset: no check"
    )
    min_rate_gbps: float | None = Field(
        None, gt=0, description="lowest acceptable negotiated rate per port in Gb/s, e.g. 400 for NDR; unset: no check"
    )
    link_layer: Literal["InfiniBand", "Ethernet", "any"] = Field(
        "any", description="link layer every port must have: InfiniBand, Ethernet (RoCE) or any"
    )
    devices_include: list[str] = Field(
        default_factory=list,
        description="only these devices or ports (glob patterns on 'mlx5_0' or 'mlx5_0/1'); empty: all",
    )
    devices_exclude: list[str] = Field(
        default_factory=list,
        description="skip these devices or ports (glob patterns), e.g. storage or management NICs",
    )
    thresholds: dict[str, CounterThreshold] = Field(
        default_factory=lambda: dict(DEFAULT_THRESHOLDS),
        description="counter rules by name (defaults: NVIDIA's NIC health monitor); a rule named here replaces "
        "the built-in rule of that name, rules not named keep their defaults. Keys of a rule: counter (default "
        "the rule name), kind ('increase' since the last run, or 'rate'), limit, per (second/minute/hour), "
        "severity (warning/critical), enabled",
    )
    flap_window_s: float = Field(86400.0, gt=0, description="how far back link flaps are remembered, seconds")
    flap_warn_count: int = Field(2, ge=1, description="this many flaps of one port within the window is a warning")
    use_ibstat: bool = Field(True, description="fall back to `ibstat` when sysfs shows no RDMA device")


class InfinibandCheck(Check):
    """RDMA ports (InfiniBand and RoCE). Same data by hand: ``grep -r . /sys/class/infiniband/*/ports/*/`` or
    ``ibstat``; counters via ``perfquery -x``."""

    name: ClassVar[str] = "infiniband"
    settings_model: ClassVar[type[CheckSettings]] = InfinibandSettings

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        settings = own_settings(self.name, settings, InfinibandSettings)
        self.settings: CheckSettings = settings
        self.cfg = settings
        self.env = env
        self._statefile = StateFile(env.state_dir / STATE_FILE_NAME)
        self._state: dict[str, Any] | None = None
        self.rules: dict[str, CounterThreshold] = {**DEFAULT_THRESHOLDS, **settings.thresholds}

    # -- reading --------------------------------------------------------------------------------------------

    def _read(self) -> tuple[list[IbPort], str] | str:
        """(ports, source) or the reason to skip."""
        class_dir = ib_class_dir(self.env.sysfs_root)
        ports = read_ports(self.env.sysfs_root)
        if ports:
            return ports, "sysfs"
        where = f"{class_dir} has no RDMA ports" if class_dir.is_dir() else f"no {class_dir}"
        if not self.cfg.use_ibstat:
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
        inc, exc = self.cfg.devices_include, self.cfg.devices_exclude
        if inc and not any(fnmatch.fnmatchcase(n, pat) for n in names for pat in inc):
            return False
        return not any(fnmatch.fnmatchcase(n, pat) for n in names for pat in exc)

    # -- state file ------------------------------------------------------------------------------------------

    def _load_state(self, current_boot: str | None) -> dict[str, Any]:
        if self._state is None:
            self._state = self._statefile.load()
        state = self._state
        ports = state.get("ports")
        if state.get("version") != STATE_VERSION or not isinstance(ports, dict):
            state = {"version": STATE_VERSION, "boot_id": current_boot, "ports": {}}
        elif state.get("boot_id") != current_boot:
            # Another boot: counters restarted from zero; flap history is still history.
            state = {
                "version": STATE_VERSION,
                "boot_id": current_boot,
                "ports": {
                    name: {"flaps": entry.get("flaps", [])} for name, entry in ports.items() if isinstance(entry, dict)
                },
            }
        self._state = state
        return state

    # -- run -------------------------------------------------------------------------------------------------

    def _absent(self, reason: str) -> CheckResult:
        """No RDMA device: fine only when no Mellanox NIC is on the PCI bus and no role needs the ports."""
        devices = read_pci_devices(self.env.sysfs_root)
        nics = mellanox_nics(devices) if devices is not None else []
        finding = rdma_absent(nics, self.env.role, self.cfg.expected_ports)
        if finding is None:
            return CheckResult.skipped(self.name, f"{reason}; no Mellanox NIC on the PCI bus")
        b = ResultBuilder(self.name)
        b.findings.append(finding)
        return b.build(f"{reason}: {finding.message}")

    def run(self) -> CheckResult:
        read = self._read()
        if isinstance(read, str):
            return self._absent(read)
        all_ports, source = read
        ports = [p for p in all_ports if self._selected(p)]
        b = ResultBuilder(self.name)
        s = self.cfg

        if not ports and not s.expected_ports:
            return CheckResult.skipped(
                self.name, f"{len(all_ports)} RDMA port(s) found, none selected by devices_include/exclude"
            )

        now = self.env.clock()
        state = self._load_state(boot_id(self.env.proc_root))
        port_states: dict[str, Any] = state["ports"]
        problems: list[str] = []

        if s.expected_ports is not None and len(ports) < s.expected_ports:
            b.finding(
                "IB_PORTS_MISSING",
                Status.CRITICAL,
                f"{len(ports)} RDMA port(s) found, {s.expected_ports} expected",
                None,
                remedy="a NIC is missing or its driver did not load: check `lspci | grep Mellanox`, "
                "`dmesg | grep mlx5` and the firmware (`mlxfwmanager`)",
            )
            problems.append(f"{s.expected_ports - len(ports)} port(s) missing")

        for port in ports:
            self._check_port(b, port, problems)
            entry = port_states.get(port.name)
            entry = entry if isinstance(entry, dict) else {}
            port_states[port.name] = self._counters(b, port, entry, now, problems)

        # Ports that vanished keep their flap history; their counter baselines would be stale.
        for name, entry in list(port_states.items()):
            if name not in {p.name for p in ports} and isinstance(entry, dict):
                flaps = self._recent_flaps(entry.get("flaps"), now)
                if flaps:
                    port_states[name] = {"flaps": flaps}
                else:
                    del port_states[name]
        state["boot_id"] = boot_id(self.env.proc_root)
        self._statefile.save(state)

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
        return b.build(summary)

    def _check_port(self, b: ResultBuilder, port: IbPort, problems: list[str]) -> None:
        s = self.cfg
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
        where = port.name + (f" ({port.netdev})" if port.netdev else "")

        if port.state is None:
            b.finding(
                "IB_PORT_STATE_UNREADABLE",
                Status.UNKNOWN,
                f"{where}: state could not be read",
                port.name,
                remedy=f"read {port.device}'s ports/{port.port}/state by hand; the driver may be resetting",
            )
            problems.append(f"{port.name} state unreadable")
        verdict = port_state_verdict(port)
        if verdict is not None:
            b.finding(verdict.code, verdict.status, verdict.message, port.name, remedy=verdict.remedy)
            problems.append(f"{port.name} {port.state}/{port.phys_state or '?'}")
            return  # a port without link has no meaningful rate

        rate = port_rate_verdict(where, port.rate_gbps, s.min_rate_gbps, port.rate_text)
        if rate is not None:
            b.finding(rate.code, rate.status, rate.message, port.name, remedy=rate.remedy)
            problems.append(f"{port.name} at {port.rate_gbps:g} Gb/s")
        if s.link_layer != "any" and port.link_layer is not None and port.link_layer != s.link_layer:
            b.finding(
                "IB_LINK_LAYER_MISMATCH",
                Status.WARNING,
                f"{where} link layer is {port.link_layer}, expected {s.link_layer}",
                port.name,
                remedy="the NIC port type differs from the fabric: check `mlxconfig -d <dev> q LINK_TYPE_P1`, "
                "or exclude this port if it serves another network",
            )
            problems.append(f"{port.name} is {port.link_layer}")

    # -- counters, rates, thresholds -------------------------------------------------------------------------

    def _recent_flaps(self, flaps: object, now: float) -> list[float]:
        if not isinstance(flaps, list):
            return []
        horizon = now - self.cfg.flap_window_s
        return [float(t) for t in flaps if isinstance(t, int | float) and horizon <= t <= now]

    def _history_counters(self) -> set[str]:
        """Counters whose rules look back further than one run (per minute / per hour)."""
        return {
            rule.counter or name
            for name, rule in self.rules.items()
            if rule.enabled and rule.kind == "rate" and PER_SECONDS[rule.per] > 1
        }

    def _counters(
        self, b: ResultBuilder, port: IbPort, entry: Mapping[str, Any], now: float, problems: list[str]
    ) -> dict[str, Any]:
        """Samples and findings from the port's counters; returns the port's new state entry."""
        labels = {"device": port.device, "port": str(port.port)}
        flaps = self._recent_flaps(entry.get("flaps"), now)
        if port.source == "sysfs" and port.counters_note:
            how = "partly unavailable" if port.counters else "unavailable"
            b.finding(
                "IB_COUNTERS_UNAVAILABLE",
                Status.OK,
                f"{port.name}: counters {how} ({port.counters_note}); what is missing is not monitored",
                port.name,
            )
        if not port.counters:
            b.sample(PORT_FLAPS, float(len(flaps)), **labels)
            return {"flaps": flaps}

        counters = dict(port.counters)
        for name, value in sorted(counters.items()):
            b.sample(PORT_COUNTER, float(value), counter=name, **labels)

        raw_ts, raw_counters = entry.get("ts"), entry.get("counters")
        prev: tuple[float, dict[str, int]] | None = None
        if isinstance(raw_ts, int | float) and isinstance(raw_counters, dict) and raw_ts < now:
            prev = (float(raw_ts), {k: v for k, v in raw_counters.items() if isinstance(v, int)})
        checkpoints = _clean_checkpoints(entry.get("checkpoints"))
        deltas: dict[str, int] = {}
        elapsed: float | None = None
        if prev is not None:
            prev_ts, prev_counters = prev
            elapsed = now - prev_ts
            for name, value in counters.items():
                before = prev_counters.get(name)
                if not isinstance(before, int):
                    continue
                if value < before:
                    # Reset (perfquery -R, driver reload, 32-bit wrap): new baseline for this counter.
                    checkpoints = [(t, {k: v for k, v in c.items() if k != name}) for t, c in checkpoints]
                    continue
                deltas[name] = value - before
        else:
            # First run, or the clock stood still or went backwards: this reading is the new baseline;
            # checkpoints from the "future" mean nothing.
            checkpoints = [(t, c) for t, c in checkpoints if t < now]

        if elapsed is not None:
            for data, metric in (("port_rcv_data", PORT_RCV_BPS), ("port_xmit_data", PORT_XMIT_BPS)):
                if data in deltas:
                    b.sample(metric, deltas[data] * DATA_WORD_BYTES / elapsed, **labels)
            for name, delta in sorted(deltas.items()):
                if name in ERROR_COUNTERS or any((r.counter or n) == name for n, r in self.rules.items()):
                    b.sample(PORT_ERRORS_PER_SECOND, delta / elapsed, counter=name, **labels)

        downs = deltas.get("link_downed", 0)
        if downs > 0:
            flaps.extend([now] * min(downs, 100))
        b.sample(PORT_FLAPS, float(len(flaps)), **labels)
        if len(flaps) >= self.cfg.flap_warn_count:
            b.finding(
                "IB_LINK_FLAPPING",
                Status.WARNING,
                f"{port.name} lost its link {len(flaps)} time(s) in the last {duration_text(self.cfg.flap_window_s)}",
                port.name,
                remedy=REMEDIES["link_downed"],
            )
            problems.append(f"{port.name} flapped {len(flaps)}x")

        if prev is not None and elapsed is not None:
            self._evaluate(b, port, counters, deltas, elapsed, now, prev, checkpoints, problems)

        checkpoints = self._add_checkpoint(checkpoints, now, counters)
        return {
            "ts": now,
            "counters": counters,
            "checkpoints": [[t, c] for t, c in checkpoints],
            "flaps": flaps,
        }

    def _evaluate(
        self,
        b: ResultBuilder,
        port: IbPort,
        counters: Mapping[str, int],
        deltas: Mapping[str, int],
        elapsed: float,
        now: float,
        prev: tuple[float, Mapping[str, int]],
        checkpoints: Sequence[tuple[float, Mapping[str, int]]],
        problems: list[str],
    ) -> None:
        reported: set[str] = set()
        # Critical rules first so one counter yields one finding, the worst.
        order = sorted(self.rules.items(), key=lambda kv: kv[1].severity != "critical")
        for rule_name, rule in order:
            counter = rule.counter or rule_name
            if not rule.enabled or counter not in deltas or counter in reported:
                continue
            status = Status.CRITICAL if rule.severity == "critical" else Status.WARNING
            if rule.kind == "increase":
                increase = deltas[counter]
                if increase <= rule.limit:
                    continue
                detail = f"{counter} rose by {increase} in {duration_text(elapsed)}"
            else:
                window = PER_SECONDS[rule.per]
                breach = rate_breach(counter, counters[counter], now, window, rule.limit, prev, checkpoints)
                if breach is None:
                    continue
                detail = f"{counter} {breach} (limit {rule.limit:g} per {rule.per})"
            reported.add(counter)
            b.finding(
                f"IB_{counter.upper()}",
                status,
                f"{port.name}: {detail}",
                port.name,
                remedy=REMEDIES.get(counter, REMEDIES.get(rule_name, "inspect the port with `mlxlink` and `ibstat`")),
            )
            problems.append(f"{port.name} {counter}")

    def _add_checkpoint(
        self, checkpoints: list[tuple[float, dict[str, int]]], now: float, counters: Mapping[str, int]
    ) -> list[tuple[float, dict[str, int]]]:
        keep = self._history_counters()
        longest = max((PER_SECONDS[r.per] for r in self.rules.values() if r.enabled and r.kind == "rate"), default=1.0)
        if not keep or longest <= 1:
            return []
        gap = longest / 60  # at most ~60 checkpoints per port
        horizon = now - longest - gap
        kept = [(t, c) for t, c in checkpoints if t >= horizon]
        if not kept or now - kept[-1][0] >= gap:
            kept.append((now, {k: v for k, v in counters.items() if k in keep}))
        return kept


def _clean_checkpoints(raw: object) -> list[tuple[float, dict[str, int]]]:
    out: list[tuple[float, dict[str, int]]] = []
    if not isinstance(raw, list):
        return out
    for item in raw:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int | float) and isinstance(item[1], dict):
            out.append((float(item[0]), {k: v for k, v in item[1].items() if isinstance(v, int)}))
    return sorted(out, key=lambda tc: tc[0])

"""InfiniBand / RoCE verdicts: port state, counter thresholds (NVIDIA's NIC health monitor) and their remedies.

Shared by ``checks/infiniband.py`` (sysfs, rates between runs) and ``diagnose`` (pasted ``ibstat`` and
``perfquery``). Sources of the thresholds: see ``DEFAULT_THRESHOLDS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from dgxdoctor.judge.consequence import judged
from dgxdoctor.result import Finding, Status
from dgxdoctor.settings.base import Frozen
from dgxdoctor.sources.sysfs_ib import IbPort

PER_SECONDS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}


# Counters whose increase means something went wrong (IBTA PortCounters, and mlx5 hw_counters as described in
# NVIDIA's "Understanding mlx5 Linux Counters"). Their rates are exported as errors_per_second; the
# `perfquery` analyzer reports the non-zero ones.
ERROR_COUNTERS = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
        "out_of_buffer",
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "implied_nak_seq_err",
        "req_cqe_error",
        "resp_cqe_error",
        "req_remote_access_errors",
        "req_remote_invalid_request",
        "resp_local_length_error",
        "resp_remote_access_errors",
        "rx_icrc_encapsulated",
        "roce_slow_restart",
    }
)


# Widths of the IBTA PortCounters error counters (IBA spec vol. 1, PortCounters attribute; the kernel reads them
# with these widths: drivers/infiniband/core/sysfs.c PORT_PMA_ATTR). A counter at its maximum stops there: the
# value means "at least this many", and a rate over it reads zero.
COUNTER_WIDTH_BITS: Mapping[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}


def saturated_counters(counters: Mapping[str, int]) -> dict[str, int]:
    """The error counters at the top of their width (65535 for a 16-bit one): counter -> that maximum."""
    out = {}
    for name, bits in COUNTER_WIDTH_BITS.items():
        top = (1 << bits) - 1
        if counters.get(name) == top:
            out[name] = top
    return out


def saturation_verdict(where: str, saturated: Mapping[str, int]) -> StateVerdict | None:
    """IB_COUNTER_SATURATED: counters stuck at their width, so neither their value nor their rate can be read."""
    if not saturated:
        return None
    listed = ", ".join(f"{name} = {top} (at least)" for name, top in sorted(saturated.items()))
    return StateVerdict(
        "IB_COUNTER_SATURATED",
        Status.WARNING,
        f"{where}: counters saturated at their width: {listed}; they no longer count, so their rates read zero",
        "the link has had at least this many errors: inspect it (`mlxlink -d <dev> -c`), then clear the counters "
        "(`perfquery -R -x <lid> <port>`) so new errors show again",
    )


class CounterThreshold(Frozen, frozen=True):
    """One rule over one counter: any increase above ``limit`` between runs, or a rate above ``limit`` per
    ``per``."""

    counter: Annotated[
        str, Meta(description="sysfs counter name (counters/ or hw_counters/); empty: the rule's name")
    ] = ""
    kind: Annotated[
        Literal["increase", "rate"],
        Meta(description="'increase': change since the last run above limit; 'rate': events per `per` above limit"),
    ] = "rate"
    limit: Annotated[
        float, Meta(ge=0, le=2.0**64, description="breach when the increase or the rate is above this")
    ] = 0.0
    per: Annotated[Literal["second", "minute", "hour"], Meta(description="time unit of a rate limit")] = "second"
    severity: Annotated[Literal["warning", "critical"], Meta(description="status of a breach")] = "warning"
    enabled: Annotated[bool, Meta(description="false switches this rule off")] = True


def _rule(kind: Literal["increase", "rate"], limit: float, severity: Literal["warning", "critical"], **kw: Any) -> Any:
    """A built-in rule, constructed: equal to the validated one (tests/unit/test_config_sections.py)."""
    return CounterThreshold(kind=kind, limit=float(limit), severity=severity, **kw)


# NVIDIA NIC health monitor defaults (see the module docstring for the source).
DEFAULT_THRESHOLDS: Mapping[str, CounterThreshold] = {
    # Fatal: any increment breaks a running job.
    "link_downed": _rule("increase", 0, "critical"),  # the port lost its link and retrained (a flap)
    "excessive_buffer_overrun_errors": _rule("increase", 0, "critical"),  # lossless flow control violated
    "local_link_integrity_errors": _rule("increase", 0, "critical"),  # physical errors over the hardware cap
    "rnr_nak_retry_err": _rule("increase", 0, "critical"),  # a connection dropped after RNR retries ran out
    # IBTA BER 1e-12: at NDR/HDR speeds that budget is 120 symbol errors per hour.
    "symbol_error_ber": _rule("rate", 120, "critical", counter="symbol_error", per="hour"),
    # Degradation: warn.
    "symbol_error": _rule("rate", 10, "warning", per="second"),
    "link_error_recovery": _rule("rate", 5, "warning", per="minute"),
    "port_rcv_errors": _rule("rate", 10, "warning", per="second"),
    "local_ack_timeout_err": _rule("rate", 1, "warning", per="second"),
    "port_xmit_discards": _rule("rate", 100, "warning", per="second"),
    "roce_slow_restart": _rule("rate", 10, "warning", per="second"),
}


REMEDIES: Mapping[str, str] = {
    "link_downed": "the link went down and retrained: reseat or replace the cable/transceiver on both ends, "
    "check the switch port, and `dmesg | grep mlx5` for port down events",
    "excessive_buffer_overrun_errors": "receive buffers overran (flow control broken): check the peer switch "
    "port's buffer/VL configuration and the cable; on RoCE check PFC on the switch",
    "local_link_integrity_errors": "physical errors exceeded the port's limit: replace the cable or transceiver",
    "rnr_nak_retry_err": "a queue pair ran out of RNR retries (the peer did not post receives in time): "
    "restart the affected job and check the peer node's health",
    "symbol_error": "bit errors on the link: clean or reseat the connectors, replace the cable/transceiver; "
    "`mlxlink -d <dev> -c` shows BER and FEC counters",
    "link_error_recovery": "the link keeps retraining: reseat or replace the cable/transceiver",
    "port_rcv_errors": "malformed/CRC-failed packets received: check the cable and the peer port",
    "local_ack_timeout_err": "ACKs time out: check the fabric path and whether the peer node is alive",
    "port_xmit_discards": "packets discarded on transmit (congestion or a stuck peer): check the switch "
    "port and congestion control",
    "roce_slow_restart": "RoCE flows keep restarting slowly: check ECN/PFC configuration on the switches",
}


class StateVerdict(Struct, frozen=True):
    code: str
    status: Status
    message: str
    remedy: str

    def finding(self, subject: str | None = None, evidence: str | None = None) -> Finding:
        """The finding of this verdict about ``subject``, with what follows from it (judge.consequence)."""
        return judged(Finding(self.code, self.status, self.message, subject, evidence, self.remedy))


def port_state_verdict(port: IbPort) -> StateVerdict | None:
    """What is wrong with a port's logical/physical state, or None when it is Active (or unknown)."""
    if port.state is None or port.active:
        return None
    phys = port.phys_state or "unknown"
    where = f"{port.name}" + (f" ({port.netdev})" if port.netdev else "")
    if port.state == "Down" and phys == "Disabled":
        return StateVerdict(
            "IB_PORT_DISABLED",
            Status.WARNING,
            f"{where} is Down, physical state Disabled (administratively off)",
            "enable the port (`ibportstate` / switch side) or list it in devices_exclude if it is unused",
        )
    if port.state == "Down":
        return StateVerdict(
            "IB_PORT_DOWN",
            Status.CRITICAL,
            f"{where} is Down, physical state {phys}",
            "no link: check the cable and transceiver on both ends and the switch port; `ibstat` must show "
            "State: Active, Physical state: LinkUp. NCCL traffic on this rail fails or falls back",
        )
    return StateVerdict(
        "IB_PORT_NOT_ACTIVE",
        Status.CRITICAL,
        f"{where} is {port.state}, physical state {phys}: the link is up but the port is not Active",
        "the subnet manager has not activated this port: check that opensm/UFM runs and sees it (`sminfo`)",
    )


def rate_breach(
    counter: str,
    value: int,
    now: float,
    window: float,
    limit: float,
    prev: tuple[float, Mapping[str, int]],
    checkpoints: Iterable[tuple[float, Mapping[str, int]]],
) -> str | None:
    """Describe the breach of "more than ``limit`` events per ``window`` seconds", or None.

    Bases are earlier readings of the counter (the last run and the checkpoints). If one lies within the
    window, the increase since the oldest such base is counted as is: more than ``limit`` events in less than
    the window already breaks the limit, and scaling a short interval up would cry wolf on a single burst.
    Otherwise the newest (older) base gives an average rate, scaled to the window.
    """
    bases = [(t, c[counter]) for t, c in checkpoints if counter in c and c[counter] <= value]
    prev_ts, prev_counters = prev
    before = prev_counters.get(counter)
    if before is not None and before <= value:
        bases.append((prev_ts, before))
    bases = [(t, v) for t, v in bases if t < now]
    if not bases:
        return None
    inside = [(t, v) for t, v in bases if t >= now - window]
    if inside:
        t, v = min(inside)
        increase = value - v
        if increase > limit:
            return f"rose by {increase} in {duration_text(now - t)}"
        return None
    t, v = max(bases)
    rate = (value - v) / (now - t) * window
    if rate > limit:
        return f"rose by {value - v} in {duration_text(now - t)}, {rate:.3g} per {duration_text(window)} on average"
    return None


def duration_text(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# ---- the live check's verdicts: each a finding with the few words it adds to the summary ----

Verdict = tuple[Finding, str]
REMEDY_PORTS_MISSING = (
    "a NIC is missing or its driver did not load: check `lspci | grep Mellanox`, `dmesg | grep mlx5` and the "
    "firmware (`mlxfwmanager`)"
)
REMEDY_LINK_LAYER = (
    "the NIC port type differs from the fabric: check `mlxconfig -d <dev> q LINK_TYPE_P1`, or exclude this port if "
    "it serves another network"
)
REMEDY_COUNTER_DEFAULT = "inspect the port with `mlxlink` and `ibstat`"


def ports_missing(found: int, expected: int | None) -> list[Verdict]:
    if expected is None or found >= expected:
        return []
    message = f"{found} RDMA port(s) found, {expected} expected"
    finding = Finding("IB_PORTS_MISSING", Status.CRITICAL, message, None, remedy=REMEDY_PORTS_MISSING)
    return [(finding, f"{expected - found} port(s) missing")]


def _where(port: IbPort) -> str:
    return port.name + (f" ({port.netdev})" if port.netdev else "")


def port_verdicts(port: IbPort, min_rate_gbps: float | None, link_layer: str) -> list[Verdict]:
    """State, negotiated rate and link layer of one port (``link_layer`` "any" accepts every one)."""
    out: list[Verdict] = []
    where = _where(port)
    if port.state is None:
        remedy = f"read {port.device}'s ports/{port.port}/state by hand; the driver may be resetting"
        unreadable = Finding(
            "IB_PORT_STATE_UNREADABLE", Status.UNKNOWN, f"{where}: state could not be read", port.name, remedy=remedy
        )
        out.append((unreadable, f"{port.name} state unreadable"))
    state = port_state_verdict(port)
    if state is not None:
        finding = Finding(state.code, state.status, state.message, port.name, remedy=state.remedy)
        return [*out, (finding, f"{port.name} {port.state}/{port.phys_state or '?'}")]  # no link: no meaningful rate
    rate = port_rate_verdict(where, port.rate_gbps, min_rate_gbps, port.rate_text)
    if rate is not None:
        low = Finding(rate.code, rate.status, rate.message, port.name, remedy=rate.remedy)
        out.append((low, f"{port.name} at {port.rate_gbps:g} Gb/s"))
    if link_layer != "any" and port.link_layer is not None and port.link_layer != link_layer:
        message = f"{where} link layer is {port.link_layer}, expected {link_layer}"
        finding = Finding("IB_LINK_LAYER_MISMATCH", Status.WARNING, message, port.name, remedy=REMEDY_LINK_LAYER)
        out.append((finding, f"{port.name} is {port.link_layer}"))
    return out


def counters_unavailable(port: IbPort) -> Finding | None:
    """Counters the driver does not offer ("N/A (no PMA)"), so absence is never read as zero: some missing is said
    (OK: the rest is watched); none readable leaves the port's errors unknown (UNKNOWN, never a plain OK)."""
    if port.source != "sysfs" or not port.counters_note:
        return None
    how = "partly unavailable" if port.counters else "unavailable"
    message = f"{port.name}: counters {how} ({port.counters_note}); what is missing is not monitored"
    return Finding("IB_COUNTERS_UNAVAILABLE", Status.OK if port.counters else Status.UNKNOWN, message, port.name)


def flap_verdict(port: str, flaps: int, warn_count: int, window_s: float) -> list[Verdict]:
    if flaps < warn_count:
        return []
    message = f"{port} lost its link {flaps} time(s) in the last {duration_text(window_s)}"
    finding = Finding("IB_LINK_FLAPPING", Status.WARNING, message, port, remedy=REMEDIES["link_downed"])
    return [(finding, f"{port} flapped {flaps}x")]


def counter_verdicts(
    port: str,
    rules: Mapping[str, CounterThreshold],
    counters: Mapping[str, int],
    deltas: Mapping[str, int],
    prev: tuple[float, Mapping[str, int]],
    checkpoints: Sequence[tuple[float, Mapping[str, int]]],
    now: float,
) -> list[Verdict]:
    """Every enabled rule over the port's counters; one finding per counter, the worst (critical rules first)."""
    out: list[Verdict] = []
    reported: set[str] = set()
    for rule_name, rule in sorted(rules.items(), key=lambda kv: kv[1].severity != "critical"):
        counter = rule.counter or rule_name
        if not rule.enabled or counter not in deltas or counter in reported:
            continue
        if rule.kind == "increase":
            if deltas[counter] <= rule.limit:
                continue
            detail = f"{counter} rose by {deltas[counter]} in {duration_text(now - prev[0])}"
        else:
            breach = rate_breach(counter, counters[counter], now, PER_SECONDS[rule.per], rule.limit, prev, checkpoints)
            if breach is None:
                continue
            detail = f"{counter} {breach} (limit {rule.limit:g} per {rule.per})"
        reported.add(counter)
        status = Status.CRITICAL if rule.severity == "critical" else Status.WARNING
        remedy = REMEDIES.get(counter, REMEDIES.get(rule_name, REMEDY_COUNTER_DEFAULT))
        out.append(
            (Finding(f"IB_{counter.upper()}", status, f"{port}: {detail}", port, remedy=remedy), f"{port} {counter}")
        )
    return out


RATE_LOW_REMEDY = (
    "the link trained below its speed or width (a lane down, a bad cable or transceiver): reseat or replace the "
    "cable; `mlxlink -d <dev> -m` shows the negotiated speed and width"
)


def port_rate_verdict(
    where: str, rate_gbps: float | None, min_rate_gbps: float | None, rate_text: str | None = None
) -> StateVerdict | None:
    """IB_PORT_RATE_LOW when an Active port negotiated less than ``min_rate_gbps`` (the checks' and diagnose's rule)."""
    if min_rate_gbps is None or rate_gbps is None or rate_gbps >= min_rate_gbps:
        return None
    shown = f" ({rate_text})" if rate_text else ""
    return StateVerdict(
        "IB_PORT_RATE_LOW",
        Status.WARNING,
        f"{where} runs at {rate_gbps:g} Gb/s, expected at least {min_rate_gbps:g} Gb/s{shown}",
        RATE_LOW_REMEDY,
    )


def mixed_rates_verdict(rates: Mapping[str, float]) -> StateVerdict | None:
    """IB_PORT_RATES_DIFFER when the Active ports of one node negotiated different rates: the slowest rail paces
    every collective (NCCL stripes over all HCAs), so one port trained down costs the whole node."""
    if len(set(rates.values())) < 2:
        return None
    top = max(rates.values())
    slow = sorted(name for name, rate in rates.items() if rate < top)
    listed = ", ".join(f"{name} {rates[name]:g}" for name in slow)
    return StateVerdict(
        "IB_PORT_RATES_DIFFER",
        Status.WARNING,
        f"Active ports run at different rates: {listed} Gb/s against {top:g} Gb/s on the others",
        RATE_LOW_REMEDY,
    )


def mixed_firmware_verdict(firmware: Mapping[str, str]) -> StateVerdict | None:
    """IB_FIRMWARE_DIFFERS when the node's HCAs of one type run different firmware versions (a partial upgrade)."""
    versions = sorted(set(firmware.values()))
    if len(versions) < 2:
        return None
    by_version = {v: sorted(ca for ca, fw in firmware.items() if fw == v) for v in versions}
    listed = "; ".join(f"{v}: {', '.join(cas)}" for v, cas in by_version.items())
    return StateVerdict(
        "IB_FIRMWARE_DIFFERS",
        Status.WARNING,
        f"HCAs run different firmware versions ({listed})",
        "a partial firmware upgrade: bring every HCA to the same version (`mlxfwmanager --query`, then "
        "`mlxfwmanager -u` and a reboot or `mlxfwreset`), so the rails behave alike",
    )


def node_verdicts(rates: Mapping[str, float], firmware: Mapping[str, tuple[str | None, str]]) -> list[Verdict]:
    """What only the node's ports together show (the rules diagnose applies to an ibstat): Active ports at different
    rates; HCAs of one type (``firmware``: device -> (hca_type, fw_ver)) on different firmware."""
    out: list[Verdict] = []
    rate = mixed_rates_verdict(rates)
    if rate is not None:
        slow = sorted(n for n, r in rates.items() if r < max(rates.values()))
        out.append((Finding(rate.code, rate.status, rate.message, None, remedy=rate.remedy), f"{', '.join(slow)} slow"))
    for hca_type in sorted({t or "" for t, _ in firmware.values()}):
        same = {dev: fw for dev, (t, fw) in firmware.items() if (t or "") == hca_type}
        fw = mixed_firmware_verdict(same)
        if fw is not None:
            out.append((Finding(fw.code, fw.status, fw.message, None, remedy=fw.remedy), "firmware differs"))
    return out


# ---- mlxlink: module temperature and effective BER per port ----

# Optical modules' operating range tops out at 70-75 °C (the range mlxlink prints beside the value, e.g.
# "[-5..75]" for NVIDIA's OSFP NDR modules); above it errors rise, and modules shut down near 85 °C.
MODULE_TEMP_WARN_C = 75.0
MODULE_TEMP_CRIT_C = 85.0
# The IBTA bit error ratio target (the same 1e-12 behind the 120 symbol errors an hour): a post-FEC BER above it
# means errors the link does not correct.
EFFECTIVE_BER_LIMIT = 1e-12


def module_temperature_verdict(port: str, celsius: float, warn: float, crit: float) -> StateVerdict | None:
    if celsius <= warn:
        return None
    status = Status.CRITICAL if celsius > crit else Status.WARNING
    return StateVerdict(
        "IB_MODULE_TEMPERATURE_HIGH",
        status,
        f"{port}: module at {celsius:g} °C (warning above {warn:g}, critical above {crit:g})",
        "check the airflow and the fans at the NIC and the switch; a module that stays hot fails: replace it",
    )


def effective_ber_verdict(port: str, ber: float, limit: float) -> StateVerdict | None:
    if ber <= limit:
        return None
    return StateVerdict(
        "IB_EFFECTIVE_BER_HIGH",
        Status.WARNING,
        f"{port}: effective (post-FEC) BER {ber:.1e}, above {limit:.0e}: errors that FEC does not correct",
        REMEDIES["symbol_error"],
    )


# Counters whose rule is "critical on any increase": in one snapshot (a pasted perfquery), any non-zero value.
CRITICAL_ON_ANY = frozenset(
    (rule.counter or name)
    for name, rule in DEFAULT_THRESHOLDS.items()
    if rule.kind == "increase" and rule.severity == "critical"
)


def snapshot_counter_finding(
    counter: str, value: int, subject: str, field: str, evidence: str | None
) -> Finding | None:
    """One error counter read once (no time base): non-zero is CRITICAL where any increase is, else WARNING."""
    if counter not in ERROR_COUNTERS or value == 0:
        return None
    return Finding(
        f"IB_{counter.upper()}",
        Status.CRITICAL if counter in CRITICAL_ON_ANY else Status.WARNING,
        f"{subject}: {field} is {value} since the counters were last cleared "
        "(one snapshot has no time base: compare two readings for a rate)",
        subject,
        evidence=evidence,
        remedy=REMEDIES.get(counter, "inspect the port with `mlxlink` and `ibstat`"),
    )

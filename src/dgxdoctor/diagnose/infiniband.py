"""`dgxdoctor diagnose` for ``ibstat`` and ``perfquery`` output (same parsers as the live check)."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.ibstat import IbstatFormatError, IbstatPort, looks_like_ibstat, parse_ibstat
from dgxdoctor.sources.perfquery import FIELD_TO_COUNTER, PerfqueryFormatError, looks_like_perfquery, parse_perfquery

_COUNTER_TO_FIELD = {v: k for k, v in FIELD_TO_COUNTER.items()}


# A port block pasted without its "CA '...'" line (a fragment): "Port 1:" then its State and Physical state.
PORT_FRAGMENT_RE = re.compile(
    r"^\s*Port \d{1,3}:\s*\n(?:[ \t]+\S[^\n]*\n){0,12}?[ \t]+State:[^\n]*\n[ \t]+Physical state:", re.M
)
# The name given to the CA of such a fragment.
UNNAMED_CA = "unnamed"


class IbstatAnalyzer:
    """The infiniband check's threshold (``diagnose --config``: [checks.infiniband] min_rate_gbps)."""

    kind: ClassVar[str] = "ibstat"

    def __init__(self, min_rate_gbps: float | None = None) -> None:
        self._min_rate = min_rate_gbps

    def detect(self, text: str) -> bool:
        return looks_like_ibstat(text) or ("Physical state:" in text and PORT_FRAGMENT_RE.search(text) is not None)

    def analyze(self, text: str) -> Diagnosis:
        if not looks_like_ibstat(text) and PORT_FRAGMENT_RE.search(text):
            # Under a named CA, indented one level more: the layout ibstat prints.
            text = f"CA '{UNNAMED_CA}'\n" + "".join(f"\t{line}\n" for line in text.splitlines())
        try:
            ports = parse_ibstat(text)
        except IbstatFormatError as exc:
            return _unparsable(self.kind, str(exc))
        lines = text.splitlines()
        findings = [*self._port_findings(ports, lines), *_node_findings(ports)]
        if not ports:
            findings.append(
                Finding(
                    "IB_NO_PORTS",
                    Status.UNKNOWN,
                    "ibstat output lists no port",
                    remedy="no RDMA device is visible: check the driver (`lsmod | grep mlx5_ib`) and `lspci`",
                )
            )
        data: dict[str, Any] = {"ports": [p.to_dict() for p in ports]}
        return Diagnosis(self.kind, tuple(findings), data)

    def _port_findings(self, ports: list[IbstatPort], lines: list[str]) -> list[Finding]:
        # The verdicts' module holds the check's rule model: loaded once a paste is ibstat, not for
        # every paste's detection (benchmarks/startup.py).
        from dgxdoctor.judge.infiniband import port_rate_verdict, port_state_verdict

        findings: list[Finding] = []
        for p in ports:
            subject = f"{p.ca}/{p.port}"
            verdict = port_state_verdict(p.to_ib_port())
            if verdict is None and p.state == "Active":
                verdict = port_rate_verdict("the port", p.rate_gbps, self._min_rate)
            if verdict is None:
                continue
            evidence = _evidence(lines, p.ca, p.port)
            findings.append(verdict.finding(subject, evidence))
        return findings


def _node_findings(ports: list[IbstatPort]) -> list[Finding]:
    from dgxdoctor.judge.infiniband import mixed_firmware_verdict, mixed_rates_verdict

    """What only the node's ports together show: Active ports at different rates, HCAs on different firmware."""
    rates = {f"{p.ca}/{p.port}": p.rate_gbps for p in ports if p.state == "Active" and p.rate_gbps is not None}
    firmware: dict[str, str] = {}
    for p in ports:
        if p.firmware and (p.ca_type or "") == (ports[0].ca_type or ""):
            firmware.setdefault(p.ca, p.firmware)
    findings = []
    for verdict in (mixed_rates_verdict(rates), mixed_firmware_verdict(firmware)):
        if verdict is not None:
            findings.append(verdict.finding())
    return findings


def _unparsable(kind: str, error: str) -> Diagnosis:
    return Diagnosis(
        kind,
        (Finding("UNPARSABLE_INPUT", Status.UNKNOWN, f"not valid {kind} output: {error}", remedy=None),),
        {"ports": []},
    )


def _evidence(lines: list[str], ca: str, port: int) -> str | None:
    """The ``State:`` line of ``ca``'s port ``port``."""
    in_ca = in_port = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("CA '"):
            in_ca, in_port = stripped == f"CA '{ca}'", False
        elif in_ca and stripped.startswith("Port ") and stripped.endswith(":"):
            in_port = stripped == f"Port {port}:"
        elif in_ca and in_port and stripped.startswith("State:"):
            return f"CA '{ca}' Port {port}: {stripped}"
    return None


class PerfqueryAnalyzer:
    kind: ClassVar[str] = "perfquery"

    def detect(self, text: str) -> bool:
        return looks_like_perfquery(text)

    def analyze(self, text: str) -> Diagnosis:
        from dgxdoctor.judge.infiniband import saturated_counters, saturation_verdict, snapshot_counter_finding

        try:
            blocks = parse_perfquery(text)
        except PerfqueryFormatError as exc:
            return _unparsable(self.kind, str(exc))
        findings: list[Finding] = []
        for block in blocks:
            subject = f"lid {block.lid} port {block.port}"
            for counter, value in block.counters.items():
                field = _COUNTER_TO_FIELD.get(counter, counter)
                finding = snapshot_counter_finding(counter, value, subject, field, block.fields.get(field))
                if finding is not None:
                    findings.append(finding)
            # Without -x the error counters are PortCounters' narrow ones (16 bits and less): at the top they stop.
            saturated = saturation_verdict(subject, saturated_counters(block.counters)) if not block.extended else None
            if saturated is not None:
                findings.append(saturated.finding(subject))
        if not blocks:
            findings.append(
                Finding("IB_NO_COUNTERS", Status.UNKNOWN, "perfquery output has no counters block", remedy=None)
            )
        data: dict[str, Any] = {
            "ports": [
                {"lid": b.lid, "port": b.port, "extended": b.extended, "counters": dict(b.counters)} for b in blocks
            ]
        }
        return Diagnosis(self.kind, tuple(findings), data)

"""The rule files shipped as package data, and the one document ``dgxdoctor rules`` prints."""

from __future__ import annotations

from importlib import resources

RECORDING_FILE = "peer_compare.rules.yml"
ALERTS_FILE = "dgxdoctor-alerts.rules.yml"
FILES = {"recording": RECORDING_FILE, "alerts": ALERTS_FILE}


def read_rule_file(name: str) -> str:
    return resources.files("dgxdoctor.alerts").joinpath(name).read_text(encoding="utf-8")


def combined(kinds: tuple[str, ...] = ("recording", "alerts")) -> str:
    """One valid rule file holding the groups of each chosen file (``groups:`` written once)."""
    out = ["groups:"]
    for kind in kinds:
        for line in read_rule_file(FILES[kind]).splitlines():
            if line.strip() != "groups:":
                out.append(line)
    return "\n".join(out) + "\n"

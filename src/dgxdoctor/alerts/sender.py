"""Alerts out: a page posted to Alertmanager's v2 API, so it reaches the receivers the operator already has."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

import httpx

ALERTS_PATH = "/api/v2/alerts"
PAGE_ALERTNAME = "DgxdoctorRemediationPage"


def page_alert(node: str, problem: str, action: str, reason: str, now: float) -> dict[str, object]:
    """One postableAlert: labels identify it (Alertmanager groups and deduplicates on them)."""
    return {
        "labels": {
            "alertname": PAGE_ALERTNAME,
            "node": node,
            "severity": "critical",
            "problem": problem,
            "dgxdoctor_suggested": action,
        },
        "annotations": {
            "summary": f"dgxdoctor on {node} needs an operator: {problem}",
            "description": reason,
        },
        "startsAt": datetime.fromtimestamp(now, timezone.utc).isoformat().replace("+00:00", "Z"),
    }


def post_alerts(base_url: str, alerts: list[Mapping[str, object]], timeout_s: float, client: httpx.Client) -> str:
    """POST the alerts; returns what happened (raises httpx.HTTPError when Alertmanager refuses or is away)."""
    answer = client.post(f"{base_url.rstrip('/')}{ALERTS_PATH}", json=alerts, timeout=timeout_s)
    answer.raise_for_status()
    return f"Alertmanager answered {answer.status_code}"

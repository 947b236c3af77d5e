"""A real Prometheus and a real Alertmanager on the host, set up as docs/remediation.md tells an operator:
Prometheus loads `dgxdoctor rules` and scrapes every node's agent; Alertmanager routes each alert that carries
``dgxdoctor_action`` to the webhook (``/alertmanager``) of the node it names, authenticated with that node's alert token
read from a credentials file. Both are stopped by their PID. Needs Debian's prometheus and
prometheus-alertmanager."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from conftest import run_cli
from harness.deployment import PORT, Node


def why_not_runnable() -> str | None:
    for tool in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian's prometheus and prometheus-alertmanager)"
    return None


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class Monitoring:
    def __init__(self, root: Path, host_ip: str, nodes: Sequence[Node]) -> None:
        self.root, self.host_ip, self.nodes = root, host_ip, list(nodes)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.prometheus_url = ""
        self.alertmanager_url = ""

    def start(self) -> None:
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        alert_files = {}  # /etc/prometheus/dgxdoctor-alert.token: a copy of each node's alert token
        for n in self.nodes:
            alert_files[n.name] = root / f"dgxdoctor-{n.name}-alert.token"
            alert_files[n.name].write_text(n.alert_token)
            alert_files[n.name].chmod(0o600)
        routes = [
            {"matchers": ['dgxdoctor_action=~"restart_vllm|restart_cluster"', f'node="{n.name}"'],
             "receiver": f"dgxdoctor-{n.name}", "group_by": ["alertname", "node"]}
            for n in self.nodes
        ]  # fmt: skip
        receivers: list[dict[str, Any]] = [{"name": "default"}] + [
            {"name": f"dgxdoctor-{n.name}", "webhook_configs": [{
                "url": f"http://{n.ip}:{PORT}/alertmanager", "send_resolved": True,
                "max_alerts": 50, "http_config": {"authorization": {"credentials_file": str(alert_files[n.name])}}}]}
            for n in self.nodes
        ]  # fmt: skip
        # The docs' route; group_wait/interval short so a test sees the webhook within seconds.
        am = {"route": {"receiver": "default", "group_by": ["group"], "group_wait": "1s", "group_interval": "1s",
                        "repeat_interval": "1h", "routes": routes}, "receivers": receivers}  # fmt: skip
        (root / "alertmanager.yml").write_text(json.dumps(am))
        rules = run_cli("rules")
        assert rules.returncode == 0, rules.stderr
        (root / "dgxdoctor.rules.yml").write_text(rules.stdout)
        am_port = free_port(self.host_ip)
        prom_port = free_port("127.0.0.1")
        self.alertmanager_url = f"http://{self.host_ip}:{am_port}"
        self.prometheus_url = f"http://127.0.0.1:{prom_port}"
        prom = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(root / "dgxdoctor.rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{self.host_ip}:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "dgxdoctor", "static_configs": [
                {"targets": [f"{n.ip}:{PORT}" for n in self.nodes]}]}],
        }  # fmt: skip
        (root / "prometheus.yml").write_text(json.dumps(prom))
        for argv, name in (
            (["prometheus-alertmanager", f"--config.file={root / 'alertmanager.yml'}", f"--storage.path={root / 'am'}",
              f"--web.listen-address={self.host_ip}:{am_port}", "--cluster.listen-address=", "--log.level=warn"], "am"),
            (["prometheus", f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'prom'}",
              f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], "prometheus"),
        ):  # fmt: skip
            with (root / f"{name}.log").open("wb") as log:
                self.procs.append(subprocess.Popen(["nice", "-n", "5", *argv], stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL))  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()

    def query(self, expr: str) -> list[dict[str, Any]]:
        doc = httpx.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}, timeout=5).json()
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict[str, Any]]:
        """Prometheus's active alerts, pending and firing."""
        found: list[dict[str, Any]] = httpx.get(f"{self.prometheus_url}/api/v1/alerts", timeout=5).json()["data"][
            "alerts"]  # fmt: skip
        return found

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        """Prometheus's firing alerts of that name (not pending)."""
        return [a for a in self.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"]

    def alertmanager_alerts(self, alertname: str) -> list[dict[str, Any]]:
        alerts = httpx.get(f"{self.alertmanager_url}/api/v2/alerts", timeout=5).json()
        return [a for a in alerts if a["labels"]["alertname"] == alertname]

"""Wiring remediation into the daemon: its targets from the checks' settings, its pager from ``[alerts]``."""

from __future__ import annotations

from collections.abc import Callable

from dgxdoctor.alerts.sender import page_alert, post_alerts
from dgxdoctor.checks.base import own_settings
from dgxdoctor.checks.ray import RaySettings
from dgxdoctor.checks.vllm import VllmSettings
from dgxdoctor.config import AlertsSettings, Config
from dgxdoctor.environment import Environment
from dgxdoctor.remediation.actions import VllmTarget
from dgxdoctor.remediation.engine import Pager, Remediator, Targets
from dgxdoctor.result import CheckResult


def make_pager(settings: AlertsSettings, env: Environment) -> Pager | None:
    """Posts a page to Alertmanager's v2 API through ``env``'s capped client; None without ``[alerts]
    alertmanager_url`` (pages are logged)."""
    url = settings.alertmanager_url
    if url is None:
        return None

    def page(node: str, problem: str, action: str, reason: str, now: float) -> str:
        with env.http_client(timeout_s=settings.timeout_s) as client:
            return post_alerts(url, [page_alert(node, problem, action, reason, now)], settings.timeout_s, client)

    return page


def targets_for(config: Config, token: str | None) -> Targets:
    """The vllm and ray checks' settings say where vLLM and Ray are; the head's peers are its workers."""
    vllm = own_settings("vllm", config.check_settings("vllm"), VllmSettings)
    ray = own_settings("ray", config.check_settings("ray"), RaySettings)
    return Targets(
        vllm=VllmTarget(
            base_url=vllm.base_url,
            model=vllm.served_model_name,
            api_key=vllm.api_key.get_secret_value() if vllm.api_key is not None else None,
            request_timeout_s=vllm.request_timeout_s,
            pid_file=vllm.pid_file,
        ),
        ray_dashboard_url=ray.dashboard_url,
        ray_nodes=ray.expected_nodes,
        ray_gpus=ray.expected_gpus,
        workers=config.daemon.peers if config.remediation.role == "head" else (),
        token=token,
        executor=config.executor,
    )


def build_remediator(config: Config, token: str | None, latest: Callable[[], dict[str, CheckResult]]) -> Remediator:
    env = config.environment(one_shot=False)
    return Remediator(
        config.remediation,
        make_pager(config.alerts, env),
        config.node,
        config.paths.state_dir,
        targets_for(config, token),
        latest,
        env=env,
    )

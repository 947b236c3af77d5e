"""``dgxdoctor remediation restart [--drain]``: an operator's planned restart of vLLM on this node.

The daemon runs it (``POST /remediation/restart`` with the peer token), so it goes through the same guard (act
mode, the breaker, the budget, one action at a time) and the same audit as remediation's own restarts, and with
``--drain`` the node leaves the balancer's rotation first (the daemon answers ``/ready`` and the agent-check port).
"""

from __future__ import annotations

from typing import Any

from dgxdoctor.config import Config, parse_listen

# The drain, the restart and its verification each have their own timeouts in [remediation]; this only bounds the
# wait for the daemon's answer.
ANSWER_SLACK_S = 60.0


def local_daemon(config: Config) -> str:
    """The local daemon's base URL (``[daemon] listen``; over TLS the node's own name, which its certificate names)."""
    host, port = parse_listen(config.daemon.listen)
    tls = config.daemon.tls_cert_file is not None
    host = (config.node if tls else "127.0.0.1") if host in ("0.0.0.0", "::", "") else host
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{host}:{port}"


def planned_restart(config: Config, drain: bool) -> tuple[int, dict[str, Any]]:
    """(HTTP status, the daemon's answer: the action's audit record, or why it refused)."""
    r = config.remediation
    wait_s = (r.drain_timeout_s + r.balancer_period_s if drain else 0) + r.command_timeout_s * 2
    wait_s += r.verify_timeout_s + (r.rejoin_timeout_s if drain else 0) + ANSWER_SLACK_S
    token = config.daemon.resolve_credentials().peer
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with config.environment().http_client(timeout_s=wait_s, peer=True) as client:
        answer = client.post(f"{local_daemon(config)}/remediation/restart", json={"drain": drain}, headers=headers)
    try:
        doc = answer.json()
    except ValueError:
        doc = {"detail": answer.text[:300]}
    return answer.status_code, doc if isinstance(doc, dict) else {"detail": str(doc)[:300]}


def render(doc: dict[str, Any]) -> str:
    if "steps" not in doc:
        return f"restart {doc.get('outcome') or 'refused'}: {doc.get('detail') or doc.get('error') or doc}"
    lines = [f"restart_vllm {doc.get('outcome')} in {doc.get('duration_s')} s (action {doc.get('id')})"]
    for step in doc["steps"]:
        lines.append(f"  {step['step']:<16} {'ok' if step['ok'] else 'FAILED':<6} {step['duration_s']:>8.1f} s  "
                     f"{step['detail']}")  # fmt: skip
    if doc.get("bundle"):
        lines.append(f"evidence: {doc['bundle']} ({doc.get('capture')})")
    return "\n".join(lines)

"""Verdicts on the peers a node compares itself with: one that gave no state, two that share a name.

Shared by ``checks/peer_compare.py``; the comparison of the snapshots themselves is ``fleet.compare``.
"""

from __future__ import annotations

from dgxdoctor.result import Finding, Status


def peer_unreachable(url: str, error: str, label: str) -> Finding:
    """A WARNING, not CRITICAL: this node may be fine; the nodes only cannot be compared meanwhile (the peer's own
    agent, or DgxdoctorAgentDown, says what is wrong there)."""
    return Finding(
        "PEER_UNREACHABLE",
        Status.WARNING,
        f"peer {url} gave no state: {error}",
        subject=label,
        remedy="check dgxdoctor on that node (systemctl status dgxdoctor) and the network between "
        "the nodes (ping, the IB/RoCE link); nodes cannot be compared meanwhile",
    )


def peer_name_clash(url: str, node: str, label: str) -> Finding:
    return Finding(
        "PEER_NAME_CLASH",
        Status.WARNING,
        f"peer {url} reports node name {node!r}, already seen; set a distinct 'node' in each node's config",
        subject=label,
    )


def peer_left_ray(ip: str, state: str | None, message: str | None) -> Finding:
    """A node Ray's table listed as ALIVE is now dead or gone: the membership does not silently shrink. A WARNING
    here: on the head, the ray check's own RAY_NODE_DEAD / RAY_NODES_MISSING carry the verdict and its action."""
    now = f"now {state}" + (f" ({message})" if message else "") if state else "now missing from the table"
    return Finding(
        "PEER_LEFT_RAY",
        Status.WARNING,
        f"node {ip} left the Ray cluster: it was ALIVE in Ray's node table, {now}; it stays a peer (UNKNOWN while "
        "it gives no state), not dropped from the list",
        subject=ip,
        remedy="on that node: `ray status`, its raylet's log (/tmp/ray/session_latest/logs/raylet.out), "
        "`systemctl status ray-worker`; a node that rejoins gets a new node id and clears this",
    )


def discovery_source_failed(source: str, error: str, kept: int) -> Finding:
    """A peer source that did not answer: its last known members are kept (Ray's table fails exactly when Ray is the
    fault), and the others still answer."""
    return Finding(
        "PEER_DISCOVERY_STALE",
        Status.WARNING,
        f"peer source {source} did not answer ({error[:200]}): its last known {kept} member(s) kept",
        subject=source,
    )


def peers_capped(found: int, cap: int) -> Finding:
    return Finding(
        "PEER_DISCOVERY_CAPPED",
        Status.WARNING,
        f"the peer sources name {found} agents; this node compares with the first {cap} (set [fleet] "
        "prometheus_url: past a few nodes Prometheus is the cluster view, not the mesh)",
    )

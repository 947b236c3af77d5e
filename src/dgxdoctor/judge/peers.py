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

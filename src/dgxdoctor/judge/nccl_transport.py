"""The verdict on the transport NCCL reported (``sources.nccl_info``): values in, findings out.

A fall-back to TCP sockets on a node that has InfiniBand/RoCE devices is CRITICAL whatever the bandwidth: the
probe may look fine on a quiet fabric, but every token's all-reduce then crosses the kernel's TCP stack.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nccl_info import NcclTransport

FIX_SOCKET = (
    "NCCL chose TCP sockets although this node has IB/RoCE HCAs: check NCCL_IB_HCA names real HCAs "
    "(ibdev2netdev), NCCL_IB_DISABLE is not 1, NCCL_NET is not 'Socket', /dev/infiniband is visible to the serving "
    "processes (containers), the ports are Active (ibstat), and for RoCE NCCL_IB_GID_INDEX; rerun with "
    "NCCL_DEBUG=INFO and look for 'Using network IB'"
)
FIX_UNSEEN = (
    "run the probe with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV (the nccl check sets them for its own "
    "command) and keep its stdout: the transport is read from NCCL's own 'via ...' lines"
)


def describe(t: NcclTransport) -> str:
    """One line: ``NET/IB x16 [mlx5_0:1/IB mlx5_1:1/IB], P2P/CUMEM x24``."""
    parts = []
    for kind, count in t.channels.items():
        devices = t.net_devices.get(kind.removeprefix("NET/"), []) if kind.startswith("NET/") else []
        shown = f" [{' '.join(devices[:8])}{' ...' if len(devices) > 8 else ''}]" if devices else ""
        parts.append(f"{kind} x{count}{shown}")
    if not parts and t.network:
        parts.append(f"network {t.network} (no channel lines)")
    return ", ".join(parts) or "not reported"


def uses_socket(t: NcclTransport) -> bool:
    # "Using network Socket" alone is printed on a single node too, where no channel crosses the network.
    return "NET/Socket" in t.channels or (not t.channels and t.network == "Socket")


def spans_nodes(t: NcclTransport, hosts: Sequence[str]) -> bool | None:
    """Did the run cross nodes: NCCL's comm line (nNodes) or the table's rank lines (hosts); None when neither says."""
    if t.nodes is None and not hosts:
        return None
    return (t.nodes or 1) > 1 or len(set(hosts)) > 1


def socket_finding(
    t: NcclTransport, *, node_has_ib: bool | None, subject: str | None = None, cross_node: bool = False
) -> Finding | None:
    """The one verdict on NCCL's TCP socket transport; None when NCCL did not use it.

    ``node_has_ib``: this node has IB/RoCE devices (sysfs), or None when unknown (a pasted log). Sockets on a node
    with HCAs are CRITICAL whatever the bandwidth; without HCAs they are the only way across nodes (WARNING) and
    harmless within one node (OK).
    """
    if not uses_socket(t):
        return None
    text = describe(t)
    evidence = t.lines.get("NET/Socket") or t.lines.get("network")
    if node_has_ib:
        return Finding(
            "NCCL_SOCKET_FALLBACK",
            Status.CRITICAL,
            f"NCCL fell back to TCP sockets on a node with IB/RoCE HCAs: {text}",
            subject,
            evidence=evidence,
            remedy=FIX_SOCKET,
        )
    why = "this node has no IB/RoCE device" if node_has_ib is False else "no usable IB/RoCE device in that run"
    return Finding(
        "NCCL_SOCKET_TRANSPORT",
        Status.WARNING if cross_node else Status.OK,
        f"NCCL used TCP sockets ({why}): {text}",
        subject,
        evidence=evidence,
        remedy=FIX_SOCKET if cross_node else None,
    )


def transport_findings(
    t: NcclTransport, *, node_has_ib: bool, subject: str | None = None, cross_node: bool = False
) -> list[Finding]:
    """Findings on one run's transport. ``node_has_ib``: this node has IB/RoCE devices (sysfs)."""
    if not t.seen:
        return [
            Finding(
                "NCCL_TRANSPORT_UNREPORTED",
                Status.UNKNOWN,
                "NCCL printed no transport lines: which transport carried the all-reduce is not known",
                subject,
                remedy=FIX_UNSEEN,
            )
        ]
    socket = socket_finding(t, node_has_ib=node_has_ib, subject=subject, cross_node=cross_node)
    if socket is not None:
        return [socket]
    evidence = next(iter(t.lines.values()), None)
    return [Finding("NCCL_TRANSPORT", Status.OK, f"transport: {describe(t)}", subject, evidence=evidence)]

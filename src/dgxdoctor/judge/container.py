"""Verdicts on vLLM's container (``[node] container``): what the runtime could not say is UNKNOWN, never OK."""

from __future__ import annotations

from dgxdoctor.result import Finding, Status


def container_unreadable(name: str, reason: str) -> Finding:
    """The runtime cannot say what the container is (not installed, its daemon down, no such container): vLLM's
    processes are not found, so nothing about them is known."""
    return Finding(
        "CONTAINER_UNREADABLE",
        Status.UNKNOWN,
        f"cannot inspect container {name}: {reason}; vLLM's processes in it are not seen",
        f"container:{name}",
        remedy="check the runtime and the name: docker inspect NAME (docker ps -a lists the containers); set "
        "[node] container to the name of vLLM's container and container_runtime to its runtime",
    )

"""Drift verdicts that a single node can give about itself (the comparison between nodes is ``fleet.compare``)."""

from __future__ import annotations

from dgxdoctor.result import Finding, Status


def model_dir_missing(root: str) -> Finding:
    """The tutorial's error 2: a model path missing on one node is exactly the drift to catch. A WARNING here;
    the host check's HOST_MODEL_DIR_MISSING is the CRITICAL prerequisite."""
    return Finding(
        "MODEL_DIR_MISSING",
        Status.WARNING,
        f"model directory {root} does not exist on this node",
        root,
        remedy="use the same model path on both nodes (check the NFS mount: mount | grep "
        f"{root}), then ray stop --force and restart the cluster",
    )

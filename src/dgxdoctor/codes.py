"""The finding codes that other modules key on: judge.consequence's table of what follows from a finding (which
remediation and the generated alert rules read), the peer comparison, the alert rules.

Each is a contract between a judge that emits it and a consumer that acts on it, so it is named once, here;
``tests/unit/test_contracts.py`` holds every one to a verdict that can emit it (a renamed code fails there,
not silently in the field). Codes nothing else reads stay literals beside their verdict.
"""

from __future__ import annotations

# judge/vllm.py: refused connection, /health timing out while idle, work queued and no progress for stall_s.
VLLM_DEAD = "VLLM_DEAD"
VLLM_HUNG = "VLLM_HUNG"
ENGINE_HUNG = "ENGINE_HUNG"
ENGINE_NO_PROGRESS = "ENGINE_NO_PROGRESS"

# judge/ray.py: a node dead, fewer nodes or GPUs than planned, the worker's raylet gone.
RAY_NODE_DEAD = "RAY_NODE_DEAD"
RAY_NODES_MISSING = "RAY_NODES_MISSING"
RAY_GPUS_MISSING = "RAY_GPUS_MISSING"
RAY_RAYLET_DOWN = "RAY_RAYLET_DOWN"

# data/signatures.toml (the logs check): a collective between the nodes failed.
NCCL_NET_FAILURE = "NCCL_NET_FAILURE"
NCCL_NETWORK_ERROR = "NCCL_NETWORK_ERROR"
NCCL_TIMEOUT = "NCCL_TIMEOUT"
NCCL_SYSTEM_ERROR = "NCCL_SYSTEM_ERROR"
GLOO_SOCKET = "GLOO_SOCKET"

# judge/infiniband.py: a link no restart brings back.
IB_PORT_DOWN = "IB_PORT_DOWN"
IB_PORT_DISABLED = "IB_PORT_DISABLED"
IB_PORT_NOT_ACTIVE = "IB_PORT_NOT_ACTIVE"
IB_LINK_FLAPPING = "IB_LINK_FLAPPING"

# fleet/compare.py: the nodes differ in hardware, versions or the model.
PEER_HARDWARE_DRIFT = "PEER_HARDWARE_DRIFT"
PEER_VERSION_SKEW = "PEER_VERSION_SKEW"
PEER_MODEL_MISMATCH = "PEER_MODEL_MISMATCH"

# judge/xid.py: XID_<n> and SXID_<n>, one per code of NVIDIA's catalog.
XID_PREFIX = "XID_"
SXID_PREFIX = "SXID_"

"""A benign line beside the real cause: which matched signatures the rest of the paste explains away.

NCCL prints ``NET/IB : No device found`` (and, at INFO, ``Failed to open libibverbs``) on every node without an
RDMA device and then uses sockets: on one node, or when the paste also shows CUDA failing, that line is not the
fault. A single-node paste with ``Cuda failure 'invalid argument'`` and libcuda not found was named
NCCL_NET_FAILURE while the CUDA failure was the cause; the CUDA-side finding is what the operator must act on.
A WARN-level verbs failure (``Call to ibv_... failed``) stays: that is the network failing, whatever else fails.

Ray's ActorDiedError opens with "The actor died unexpectedly before finishing this task" whatever killed the actor;
its reason follows: "because its worker process has died" (RAY_WORKER_DIED) or "because its node has died" (a node
lost: RAY_NODE_LOST, with the GCS's "Health check failed for node"). Where the paste says the node died and no
worker-process death, the opening line is the node's loss, not a dead worker (ray-project/ray#34971).

The kernel's own XID 79 line (``NVRM: Xid (PCI:...): 79, ... GPU has fallen off the bus``) is the kernel-log
reader's (XID_79 with its GPU); GPU_LOST names the same fault only where an application echoes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dgxdoctor.lazy_re import lazy_compile

# gpu5:35917:35994 [0] NCCL INFO NET/IB : No device found.            (NVIDIA/nccl#226)
# dtrifiro-gpu:150030:150215 [0] NCCL INFO Failed to open libibverbs.so[.1]   (vllm-project/vllm#5360)
NCCL_FALLBACK_INFO = lazy_compile(r"NCCL INFO (?:NET/IB ?: ?No device found|Failed to open libibverbs)")

# May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
# May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.
#   (NVIDIA/open-gpu-kernel-modules#1151: tests/fixtures/kernel_log/open_gpu_1151_journal_xid79.txt)
KERNEL_XID79 = lazy_compile(r"NVRM: (?:Xid \(|GPU \S+: GPU has fallen off the bus)")

# RAY_WORKER_DIED's lines that name no cause of their own (the ActorDiedError's opening line, the wrapped task's).
#   ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.   (ray-project/ray#34971)
#   ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=18948, ...)     (RL-Factory#8)
RAY_ACTOR_DIED_OPENING = lazy_compile(
    r"The actor died unexpectedly before finishing this task|RayTaskError\(ActorDiedError\)"
)

# Classes whose line says the GPU side failed: beside one of them NCCL's fallback notice is not the cause.
CUDA_SIDE = frozenset(
    {
        "CUDA_UNHANDLED_ERROR",
        "CUDA_DRIVER_INIT",
        "CUDA_ILLEGAL_ACCESS",
        "CUDA_P2P_UNSUPPORTED",
        "CUDA_ECC_ERROR",
        "CUDA_RUNTIME_ERROR",
        "CUDA_LIBRARY_ERROR",
        "GPU_LOST",
        "NO_GPU_VISIBLE",
        "NCCL_DUPLICATE_GPU",
        "SHM_TOO_SMALL",
    }
)


def explained_away(lines_by_code: Mapping[str, Sequence[str]]) -> set[str]:
    """Codes to drop: NCCL_NET_FAILURE when every line of it is NCCL's INFO fallback notice and a CUDA-side
    failure is in the same text; RAY_WORKER_DIED when every line of it is an ActorDiedError's opening and the
    text says the node died (RAY_NODE_LOST); GPU_LOST when every line of it is a kernel line and one is XID 79 (the
    kernel-log reader names that GPU)."""
    drop = set()
    net = lines_by_code.get("NCCL_NET_FAILURE")
    if net and CUDA_SIDE & set(lines_by_code) and all(NCCL_FALLBACK_INFO.search(line) for line in net):
        drop.add("NCCL_NET_FAILURE")
    worker = lines_by_code.get("RAY_WORKER_DIED")
    if worker and "RAY_NODE_LOST" in lines_by_code and all(RAY_ACTOR_DIED_OPENING.search(line) for line in worker):
        drop.add("RAY_WORKER_DIED")
    lost = lines_by_code.get("GPU_LOST")
    if lost and all("NVRM: " in line for line in lost) and any(KERNEL_XID79.search(line) for line in lost):
        drop.add("GPU_LOST")
    return drop

"""Big logs of one kind each, built from the real excerpts of the project's corpus (for ``diagnose_scan.py --kinds``).

Each kind repeats its excerpts, as they were printed, until the size asked for, with the numbers of four or more
digits (pids, ports, addresses, microseconds) changed on every repetition, so that no two repetitions are the same
text. The excerpts are the corpus's own files (``tests/fixtures/``, each with its source in the SOURCES.md beside
it), read at run time; PyTorch's ProcessGroupNCCL banner has no excerpt there, so its lines are written here in the
formats PyTorch's ``ProcessGroupNCCL.cpp`` logs them at INFO (the one-record-per-option form of 2.0, the one-line
``initialization options`` of 2.1-2.3, the ``environments`` lines of 2.4 on with glog's stamp and the torchrun rank
prefix, 2.6's HeartbeatMonitor and Watchdog lines), with varied ranks, stamps and thread ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
HEALTHY = FIXTURES / "corpus" / "healthy"

# What each kind is read from (relative to tests/fixtures).
EXCERPTS: dict[str, tuple[str, ...]] = {
    # vLLM 0.32 V1 start (KV-cache profiling of the CPU build), requests served, a requested stop.
    "vllm-v1-start-serve-stop": ("corpus/healthy/captured_vllm_0.32_cpu_start_serve_stop.txt",),
    # V1 start-up lines around the KV-cache profile: memory, KV cache size, concurrency, graph capture, routes.
    "vllm-v1-startup-kv-cache": (
        "corpus/healthy/vllm_0.10_v1_multiproc_startup_userwarning.txt",
        "corpus/healthy/vllm_0.7.3_v1_startup_routes.txt",
        "corpus/healthy/vllm_0.8_ray_tpu_engine_ready.txt",
        "corpus/healthy/vllm_0.6.4_v0_engine_config.txt",
    ),
    "nccl-init": (
        "corpus/healthy/nccl_2.19_two_nodes_init_complete.txt",
        "corpus/healthy/nccl_2.2x_init_complete.txt",
        "corpus/healthy/nccl_2.7.8_roce_init.txt",
        "corpus/healthy/vllm_0.4.1_tp2_nccl_shm_custom_allreduce_disabled.txt",
        "corpus/healthy/vllm_v1_ray_dgx_spark_nccl_channels.txt",
        "nccl_info/ib_two_nodes_hpcx.log",
        "nccl_info/nvls_sharp_one_node.log",
        "nccl_info/p2p_direct_and_net_ib.log",
    ),
    # Python warnings at start-up (FutureWarning, UserWarning, DeprecationWarning with their source lines).
    "startup-warnings": (
        "corpus/healthy/vllm_0.4.2_ray_tp8_startup_futurewarnings.txt",
        "corpus/healthy/vllm_0.10_v1_multiproc_startup_userwarning.txt",
    ),
    "serving-access-log": ("corpus/healthy/vllm_0.5_v0_serving_requests.txt",),
    "ray": (
        "corpus/healthy/ray_2.x_vllm_connect.txt",
        "corpus/healthy/ray_2.x_vllm_multinode_nccl_p2p.txt",
        "corpus/healthy/vllm_0.6_multinode_ray_nccl_ib_init.txt",
    ),
    # Kernel lines of GPU nodes that are no fault (NVRM, mlx5, AER, EDAC, nvidia-peermem look-alikes, kmsg records).
    "kernel": (
        "kernel_log/lookalikes.txt",
        "kernel_log/faults_lookalikes.txt",
        "kernel_log/kmsg_records_h200_580.txt",
    ),
}

# PyTorch's ProcessGroupNCCL banner, one repetition: {r} rank, {md} month and day, {t} time, {us} fraction, {tid}.
_PG_BANNER = (
    "[I ProcessGroupNCCL.cpp:850] [Rank {r}] NCCL watchdog thread started!\n"
    "[I ProcessGroupNCCL.cpp:672] [Rank {r}] ProcessGroupNCCL initialized with following options:\n"
    "NCCL_ASYNC_ERROR_HANDLING: 1\n"
    "NCCL_DESYNC_DEBUG: 0\n"
    "NCCL_BLOCKING_WAIT: 0\n"
    "TIMEOUT(ms): 1800000\n"
    "USE_HIGH_PRIORITY_STREAM: 0\n"
    "[I ProcessGroupNCCL.cpp:686] [Rank {r}] ProcessGroupNCCL initialization options:NCCL_ASYNC_ERROR_HANDLING: 1, "
    "NCCL_DESYNC_DEBUG: 0, NCCL_ENABLE_TIMING: 0, NCCL_BLOCKING_WAIT: 0, TIMEOUT(ms): 1800000, "
    "USE_HIGH_PRIORITY_STREAM: 0, TORCH_DISTRIBUTED_DEBUG: OFF, NCCL_DEBUG: OFF, ID=94{tid}\n"
    "[rank{r}]:[I{md} {t}.{us} ProcessGroupNCCL.cpp:905] [PG ID 1 PG GUID 1 Rank {r}] ProcessGroupNCCL "
    "initialization options: size: 8, global rank: {r}, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0, "
    "SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 1\n"
    "[rank{r}]:[I{md} {t}.{us} ProcessGroupNCCL.cpp:914] [PG ID 1 PG GUID 1 Rank {r}] ProcessGroupNCCL "
    "environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 1, TORCH_NCCL_DUMP_ON_TIMEOUT: 0, "
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: 60000, TORCH_NCCL_DESYNC_DEBUG: 0, TORCH_NCCL_ENABLE_TIMING: 0, "
    "TORCH_NCCL_BLOCKING_WAIT: 0, TORCH_DISTRIBUTED_DEBUG: OFF, TORCH_NCCL_ENABLE_MONITORING: 1, "
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: 480, TORCH_NCCL_TRACE_BUFFER_SIZE: 0, TORCH_NCCL_COORD_CHECK_MILSEC: 1000, "
    "TORCH_NCCL_NAN_CHECK: 0, TORCH_NCCL_CUDA_EVENT_CACHE: 0, TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN: 1\n"
    "I{md} {t}.{us} {tid} ProcessGroupNCCL.cpp:1669] [PG ID 0 PG GUID 0 Rank {r}] HeartbeatMonitor environments: "
    "TORCH_NCCL_ENABLE_MONITORING (Whether to kill program when no watchdog heartbeat detected): 1, "
    "TORCH_NCCL_DUMP_ON_TIMEOUT: 1, TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: 15000, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: "
    "480, TORCH_NCCL_COORD_CHECK_MILSEC: 1000, TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN: 1\n"
    "I{md} {t}.{us} {tid} ProcessGroupNCCL.cpp:1998] [PG ID 0 PG GUID 0 Rank {r}] PGNCCL Watchdog environments: "
    "TORCH_NCCL_RETHROW_CUDA_ERRORS: 1, TORCH_NCCL_PROPAGATE_ERROR: 0, TORCH_NCCL_DESYNC_DEBUG: 0\n"
)


def _banner(n: int) -> str:
    return _PG_BANNER.format(
        r=n % 8,
        md=f"{1 + n % 12:02d}{1 + n % 28:02d}",
        t=f"{n % 24:02d}:{n % 60:02d}:{n * 7 % 60:02d}",
        us=f"{n * 7919 % 10**9:09d}",
        tid=4030959 + n % 5000,
    )


_NUMBER = re.compile(r"\d{4,}")


def _varied(text: str, n: int) -> str:
    """``text`` with each number of four or more digits moved by ``n`` (same width)."""
    return _NUMBER.sub(lambda m: str((int(m[0]) + n) % 10 ** len(m[0])).zfill(len(m[0])), text)


def _repetitions(kind: str) -> Callable[[int], str]:
    if kind == "pytorch-pg-nccl-banner":
        return _banner
    texts = ((FIXTURES / name).read_text(encoding="utf-8") for name in EXCERPTS[kind])
    text = "".join(t if t.endswith("\n") else t + "\n" for t in texts)
    return lambda n: _varied(text, n)


KINDS: tuple[str, ...] = (*EXCERPTS, "pytorch-pg-nccl-banner")


def chunks(kind: str, megabytes: float) -> Iterator[str]:
    """The log of ``kind``, about ``megabytes`` MB of it, in chunks of about 1 MB."""
    repeat, target, size, n = _repetitions(kind), megabytes * 1e6, 0, 0
    while size < target:
        parts, part = [], 0
        while part < 1e6 and size + part < target:
            text = repeat(n)
            parts.append(text)
            part += len(text.encode("utf-8"))
            n += 1
        size += part
        yield "".join(parts)


def write_kind(path: Path, kind: str, megabytes: float) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for chunk in chunks(kind, megabytes):
            fh.write(chunk)

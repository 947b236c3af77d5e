"""Input kinds `dgxdoctor diagnose` recognises: sections (a tool's output) and line readers (logs, any text).

Every section kind found in a paste is read; then the first line reader that takes it (vLLM log, Ray log, NCCL log,
else any text showing a known failure signature). ``ANALYZERS`` is both, in the order a forced ``--kind`` lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from dgxdoctor.diagnose.base import Analyzer, Diagnosis, diagnose_all, diagnose_text
from dgxdoctor.diagnose.infiniband import IbstatAnalyzer, PerfqueryAnalyzer
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.diagnose.logs import NcclLogAnalyzer, RayLogAnalyzer, TextAnalyzer, VllmLogAnalyzer
from dgxdoctor.diagnose.nccl_tests import NcclTestsAnalyzer
from dgxdoctor.diagnose.nvidia_smi import NvidiaSmiQueryAnalyzer, NvidiaSmiTableAnalyzer, NvlinkStatusAnalyzer
from dgxdoctor.diagnose.ras import RasAnalyzer
from dgxdoctor.diagnose.ray_status import RayStatusAnalyzer
from dgxdoctor.diagnose.topo import TopoAnalyzer
from dgxdoctor.diagnose.vllm_metrics import VllmMetricsAnalyzer
from dgxdoctor.judge.nccl import DEFAULT_MIN_FRACTION
from dgxdoctor.judge.ray import DEFAULT_EXPECTED_GPUS, DEFAULT_EXPECTED_NODES
from dgxdoctor.result import Finding, Status

# What a compressed paste starts with, and the command that reads it (`zcat FILE | dgxdoctor diagnose -`).
COMPRESSED_MAGIC = (
    (b"\x1f\x8b", "gzip", "zcat"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstdcat"),
    (b"BZh", "bzip2", "bzcat"),
    (b"\xfd7zXZ\x00", "xz", "xzcat"),
)


class CompressedInput(ValueError):
    """The input is a compressed file: diagnose reads text."""

    def __init__(self, kind: str, reader: str) -> None:
        super().__init__(f"{kind}-compressed")
        self.reader = reader


class Thresholds(Struct, frozen=True):
    """What a pasted section is judged against: the checks' own settings with ``diagnose --config``
    (``commands.diagnose.thresholds``), else their defaults, which live in judge/ beside the verdicts."""

    ib_min_rate_gbps: float | None = None
    nccl_expected_busbw_gbps: float | None = None
    nccl_min_fraction: float = DEFAULT_MIN_FRACTION
    ray_expected_nodes: int = DEFAULT_EXPECTED_NODES
    ray_expected_gpus: int = DEFAULT_EXPECTED_GPUS


def sections(thresholds: Thresholds | None = None) -> tuple[Analyzer, ...]:
    """The section analyzers, judging with ``thresholds`` (the defaults when None)."""
    t = thresholds or Thresholds()
    return (
        IbstatAnalyzer(t.ib_min_rate_gbps),
        PerfqueryAnalyzer(),
        TopoAnalyzer(),
        NvidiaSmiQueryAnalyzer(),
        NvidiaSmiTableAnalyzer(),
        NvlinkStatusAnalyzer(),
        NcclTestsAnalyzer(t.nccl_expected_busbw_gbps, t.nccl_min_fraction),
        RasAnalyzer(),
        VllmMetricsAnalyzer(),
        RayStatusAnalyzer(t.ray_expected_nodes, t.ray_expected_gpus),
        KernelLogAnalyzer(),
    )


SECTIONS = sections()
LINE_READERS: tuple[Analyzer, ...] = (VllmLogAnalyzer(), RayLogAnalyzer(), NcclLogAnalyzer(), TextAnalyzer())
ANALYZERS: tuple[Analyzer, ...] = SECTIONS + LINE_READERS


def diagnose(text: str, kind: str | None = None, thresholds: Thresholds | None = None) -> Sequence[Diagnosis]:
    """What ``dgxdoctor diagnose`` reports for one input: every kind in it, or the one ``kind`` forces."""
    found = sections(thresholds) if thresholds else SECTIONS
    if kind is not None:
        return (diagnose_text(text, found + LINE_READERS, kind),)
    return diagnose_all(text, found, LINE_READERS)


def diagnose_bytes(raw: bytes, kind: str | None = None, thresholds: Thresholds | None = None) -> Sequence[Diagnosis]:
    """``diagnose`` of one input as read: a compressed one raises ``CompressedInput``, an empty one is UNKNOWN."""
    for magic, name, reader in COMPRESSED_MAGIC:
        if raw.startswith(magic):
            raise CompressedInput(name, reader)
    if not raw.strip():
        empty = Finding("EMPTY_INPUT", Status.UNKNOWN, "empty input: nothing to read")
        return (Diagnosis("empty", (empty,), summary="empty input"),)
    return diagnose(raw.decode("utf-8", errors="replace"), kind, thresholds)

"""Input kinds `dgxdoctor diagnose` recognises: sections (a tool's output) and line readers (logs, any text).

Every section kind found in a paste is read; then the first line reader that takes it (vLLM log, Ray log, else
any text showing a known failure signature). ``ANALYZERS`` is both, in the order a forced ``--kind`` lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.diagnose.base import Analyzer, Diagnosis, diagnose_all, diagnose_text
from dgxdoctor.diagnose.infiniband import IbstatAnalyzer, PerfqueryAnalyzer
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.diagnose.logs import RayLogAnalyzer, TextAnalyzer, VllmLogAnalyzer
from dgxdoctor.diagnose.nccl_tests import NcclTestsAnalyzer
from dgxdoctor.diagnose.ray_status import RayStatusAnalyzer
from dgxdoctor.diagnose.topo import TopoAnalyzer
from dgxdoctor.diagnose.vllm_metrics import VllmMetricsAnalyzer

SECTIONS: tuple[Analyzer, ...] = (
    IbstatAnalyzer(),
    PerfqueryAnalyzer(),
    TopoAnalyzer(),
    NcclTestsAnalyzer(),
    VllmMetricsAnalyzer(),
    RayStatusAnalyzer(),
    KernelLogAnalyzer(),
)
LINE_READERS: tuple[Analyzer, ...] = (VllmLogAnalyzer(), RayLogAnalyzer(), TextAnalyzer())
ANALYZERS: tuple[Analyzer, ...] = SECTIONS + LINE_READERS


def diagnose(text: str, kind: str | None = None) -> Sequence[Diagnosis]:
    """What ``dgxdoctor diagnose`` reports for one input: every kind in it, or the one ``kind`` forces."""
    if kind is not None:
        return (diagnose_text(text, ANALYZERS, kind),)
    return diagnose_all(text, SECTIONS, LINE_READERS)

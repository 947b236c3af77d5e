"""Input kinds `dgxdoctor diagnose` recognises, tried in this order (most specific first).

Log kinds come last: any line that looks like vLLM or Ray output would claim the input.
"""

from __future__ import annotations

from dgxdoctor.diagnose.base import Analyzer
from dgxdoctor.diagnose.infiniband import IbstatAnalyzer, PerfqueryAnalyzer
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer
from dgxdoctor.diagnose.logs import RayLogAnalyzer, VllmLogAnalyzer
from dgxdoctor.diagnose.nccl_tests import NcclTestsAnalyzer
from dgxdoctor.diagnose.ray_status import RayStatusAnalyzer
from dgxdoctor.diagnose.topo import TopoAnalyzer
from dgxdoctor.diagnose.vllm_metrics import VllmMetricsAnalyzer

ANALYZERS: tuple[Analyzer, ...] = (
    IbstatAnalyzer(),
    PerfqueryAnalyzer(),
    TopoAnalyzer(),
    NcclTestsAnalyzer(),
    VllmMetricsAnalyzer(),
    RayStatusAnalyzer(),
    KernelLogAnalyzer(),
    VllmLogAnalyzer(),
    RayLogAnalyzer(),
)

"""Input kinds `dgxdoctor diagnose` recognises, tried in this order (most specific first)."""

from __future__ import annotations

from dgxdoctor.diagnose.base import Analyzer
from dgxdoctor.diagnose.infiniband import IbstatAnalyzer, PerfqueryAnalyzer
from dgxdoctor.diagnose.kernel_log import KernelLogAnalyzer

ANALYZERS: tuple[Analyzer, ...] = (
    IbstatAnalyzer(),
    PerfqueryAnalyzer(),
    KernelLogAnalyzer(),
)

"""Input kinds `dgxdoctor diagnose` recognises, tried in this order (most specific first)."""

from __future__ import annotations

from dgxdoctor.diagnose.base import Analyzer
from dgxdoctor.diagnose.logs import RayLogAnalyzer, VllmLogAnalyzer
from dgxdoctor.diagnose.nccl_tests import NcclTestsAnalyzer

ANALYZERS: tuple[Analyzer, ...] = (
    NcclTestsAnalyzer(),
    VllmLogAnalyzer(),
    RayLogAnalyzer(),
)

"""Input kinds `dgxdoctor diagnose` recognises, tried in this order (most specific first)."""

from __future__ import annotations

from dgxdoctor.diagnose.base import Analyzer
from dgxdoctor.diagnose.ray_status import RayStatusAnalyzer

ANALYZERS: tuple[Analyzer, ...] = (RayStatusAnalyzer(),)

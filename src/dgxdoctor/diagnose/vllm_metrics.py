"""`dgxdoctor diagnose` of a pasted vLLM ``/metrics`` page (``curl -s http://HOST:8000/metrics``).

One snapshot has no history: "sustained" and "for long" cannot be judged from it, so the findings say what the
snapshot shows and what would make it a problem; the live check judges over time.
"""

from __future__ import annotations

import re
from typing import ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.vllm import snapshot_findings
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.prom_text import PromTextError
from dgxdoctor.sources.vllm_metrics import (
    ALL_NAMES,
    KV_CACHE_USAGE,
    REQUESTS_WAITING,
    NotVllmMetrics,
    parse_vllm_metrics,
    window_stats,
)

# A sample line of one of vLLM's metrics, e.g.
# vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
VLLM_SAMPLE_RE = re.compile(r"^(?:" + "|".join(re.escape(n) for n in ALL_NAMES) + r")[{ ]", re.MULTILINE)


def _line(text: str, names: tuple[str, ...]) -> str | None:
    for name in names:
        m = re.search(rf"^{re.escape(name)}[{{ ].*$", text, re.MULTILINE)
        if m:
            return m.group(0).strip()
    return None


class VllmMetricsAnalyzer:
    kind: ClassVar[str] = "vllm-metrics"

    def detect(self, text: str) -> bool:
        return "vllm:" in text and VLLM_SAMPLE_RE.search(text) is not None

    def analyze(self, text: str) -> Diagnosis:
        try:
            m = parse_vllm_metrics(text)
        except (PromTextError, NotVllmMetrics) as exc:
            return Diagnosis(
                self.kind,
                (
                    Finding(
                        "METRICS_UNPARSEABLE",
                        Status.UNKNOWN,
                        str(exc),
                        remedy="paste the whole output of `curl -s http://HOST:8000/metrics`",
                    ),
                ),
            )
        since_start = window_stats(m, None, 0.0)
        findings = snapshot_findings(m, kv_line=_line(text, KV_CACHE_USAGE), queue_line=_line(text, REQUESTS_WAITING))
        data = {
            "kv_cache_usage": m.kv_cache_usage,
            "num_requests_waiting": m.num_requests_waiting,
            "num_requests_running": m.num_requests_running,
            "preemptions_total": m.preemptions_total,
            "ttft_p99_s": since_start.ttft_p99_s,
            "itl_p99_s": since_start.itl_p99_s,
            "model_names": list(m.model_names),
            "kv_cache_metric": m.kv_cache_metric,
        }
        return Diagnosis(self.kind, tuple(findings), data)

"""`dgxdoctor diagnose` of a pasted vLLM ``/metrics`` page (``curl -s http://HOST:8000/metrics``).

One snapshot has no history: "sustained" and "for long" cannot be judged from it, so the findings say what the
snapshot shows and what would make it a problem; the live check judges over time.
"""

from __future__ import annotations

import re
from typing import ClassVar

from dgxdoctor.checks.vllm import DEFAULT_KV_CACHE_WARN
from dgxdoctor.diagnose.base import Diagnosis
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
        return VLLM_SAMPLE_RE.search(text) is not None

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
        findings: list[Finding] = []
        if m.kv_cache_usage is not None and m.kv_cache_usage >= DEFAULT_KV_CACHE_WARN:
            findings.append(
                Finding(
                    "KV_CACHE_HIGH",
                    Status.WARNING,
                    f"KV cache usage {m.kv_cache_usage * 100:.0f}% (at or above {DEFAULT_KV_CACHE_WARN * 100:.0f}%); "
                    "a problem when it stays there",
                    evidence=_line(text, KV_CACHE_USAGE),
                    remedy="if sustained: scale out or lower the concurrency; more cache: --kv-cache-dtype fp8, a "
                    "smaller --max-model-len, then --gpu-memory-utilization",
                )
            )
        if (m.num_requests_waiting or 0) > 0:
            findings.append(
                Finding(
                    "QUEUE_WAITING",
                    Status.WARNING,
                    f"{m.num_requests_waiting:g} requests waiting ({m.num_requests_running or 0:g} running); a "
                    "queue that stays non-zero means the concurrency cap is too low",
                    evidence=_line(text, REQUESTS_WAITING),
                    remedy="if it stays non-zero: raise --max-num-seqs if the KV cache allows, or add capacity",
                )
            )
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

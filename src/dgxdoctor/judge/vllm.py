"""vLLM verdicts: KV cache, queue, preemptions, latency, progress; shared by ``checks/vllm.py`` and ``diagnose``."""

from __future__ import annotations

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.vllm_metrics import VllmMetrics

# The tutorial's maintenance section: "KV Cache 使用率持续 > 0.9 就该扩容或降并发".
# KV cache usage (0..1) that, as a mean over the window, is a WARNING.
DEFAULT_KV_CACHE_WARN = 0.9


def snapshot_findings(
    m: VllmMetrics, kv_line: str | None = None, queue_line: str | None = None, kv_warn: float = DEFAULT_KV_CACHE_WARN
) -> list[Finding]:
    """What one ``/metrics`` snapshot shows (no history: "sustained" cannot be judged from it)."""
    findings: list[Finding] = []
    if m.kv_cache_usage is not None and m.kv_cache_usage >= kv_warn:
        findings.append(
            Finding(
                "KV_CACHE_HIGH",
                Status.WARNING,
                f"KV cache usage {m.kv_cache_usage * 100:.0f}% (at or above {kv_warn * 100:.0f}%); "
                "a problem when it stays there",
                evidence=kv_line,
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
                evidence=queue_line,
                remedy="if it stays non-zero: raise --max-num-seqs if the KV cache allows, or add capacity",
            )
        )
    return findings

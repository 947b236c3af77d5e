"""Remediation's metrics: what it did, whether its breaker is open, which mode it is in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from dgxdoctor.exporters.snapshot import SnapshotCollector, family, one_hot, single
from dgxdoctor.result import MetricSpec

ACTIONS_TOTAL = MetricSpec(
    "dgxdoctor_remediation_actions_total",
    "remediation actions since dgxdoctor started, by action (restart_vllm, restart_cluster, page, and a worker's "
    "ray_stop/ray_start/vllm_stop/vllm_start steps) and outcome (success, failed, interrupted; a page: sent, "
    "logged, failed; a step: success, failed, refused); every pair at 0 from the start (21 series)",
    "counter",
    ("action", "outcome"),
)
BREAKER_OPEN = MetricSpec(
    "dgxdoctor_remediation_breaker_open",
    "1 while the remediation breaker is open (budget spent; nothing runs until `dgxdoctor remediation reset`)",
)
MODE = MetricSpec(
    "dgxdoctor_remediation_mode",
    "1 for the remediation mode in force (observe: decide and log only; act: run the actions; disabled: the state "
    "file was invalid and set aside, or cannot be read: nothing runs until `dgxdoctor remediation reset`), 0 for "
    "the others",
    labels=("mode",),
)
STATE_INVALID = MetricSpec(
    "dgxdoctor_remediation_state_invalid_total",
    "remediation state files found invalid (bad JSON or shape) since dgxdoctor started; each was renamed aside "
    "(remediation-state.json.invalid-<time>) and replaced by a state with the breaker open",
    "counter",
)
ALERTS_DROPPED = MetricSpec(
    "dgxdoctor_remediation_alerts_dropped_total",
    "firing webhook alerts not queued because 32 distinct alert names were already queued",
    "counter",
)
ALERTS_HELD = MetricSpec(
    "dgxdoctor_remediation_alerts_held_total",
    "firing alerts with dgxdoctor_action not acted on because their evidence predates the last action (they started "
    "before it ended, or this node's own check has not seen their code since), once per alert episode; each also "
    "audited as a hold",
    "counter",
)
FLEET_BREAKER_OPEN = MetricSpec(
    "dgxdoctor_remediation_fleet_breaker_open",
    "1 while the fleet breaker is tripped: more than [remediation] fleet_breaker_fraction of the fleet's nodes or "
    "serving groups unhealthy at once, so no restart runs and a page goes out instead; closes by itself when the "
    "fleet recovers (docs/fleet.md)",
)
FLEET_REFUSED = MetricSpec(
    "dgxdoctor_remediation_fleet_refused_total",
    "restarts the fleet breaker refused since dgxdoctor started (each also audited as a refusal)",
    "counter",
)
DRAINS_TOTAL = MetricSpec(
    "dgxdoctor_drains_total",
    "drains before a restart since dgxdoctor started, by how they ended: drained (vLLM's running and waiting "
    "requests reached 0), timeout (drain_timeout_s first), hung (the engine could not drain: the balancer's period "
    "only), dead (nothing in flight), unreadable (vLLM's counters unreadable); every outcome at 0 from the start",
    "counter",
    ("outcome",),
)
DRAIN_SECONDS_TOTAL = MetricSpec(
    "dgxdoctor_drain_seconds_total",
    "seconds spent draining (out of rotation, before the restart), summed: with dgxdoctor_drains_total, the mean",
    "counter",
)
DRAIN_LAST_SECONDS = MetricSpec(
    "dgxdoctor_drain_last_seconds", "the last drain's duration, seconds (NaN before the first)"
)
REMEDIATION_METRICS = (
    ACTIONS_TOTAL, BREAKER_OPEN, MODE, STATE_INVALID, ALERTS_DROPPED, ALERTS_HELD, FLEET_BREAKER_OPEN, FLEET_REFUSED,
    DRAINS_TOTAL, DRAIN_SECONDS_TOTAL, DRAIN_LAST_SECONDS,
)  # fmt: skip
MODES = ("observe", "act", "disabled")
# The counters of one series each: (spec, the key of Remediator.metrics()).
COUNTERS = (
    (STATE_INVALID, "state_invalid"), (ALERTS_DROPPED, "alerts_dropped"), (ALERTS_HELD, "alerts_held"),
    (FLEET_REFUSED, "fleet_refused"),
)  # fmt: skip


class RemediationCollector(SnapshotCollector):
    def families(self, node: str, snap: dict[str, Any]) -> Iterator[Metric]:
        yield family(ACTIONS_TOTAL, node, sorted(snap["actions"].items()))
        yield single(BREAKER_OPEN, node, 1.0 if snap["breaker_open"] else 0.0)
        yield one_hot(MODE, node, MODES, snap["mode"])
        yield single(FLEET_BREAKER_OPEN, node, 1.0 if snap.get("fleet_breaker_open") else 0.0)
        for spec, key in COUNTERS:
            yield single(spec, node, snap.get(key, 0))
        yield family(DRAINS_TOTAL, node, (((outcome,), n) for outcome, n in sorted(snap.get("drains", {}).items())))
        yield single(DRAIN_SECONDS_TOTAL, node, snap.get("drain_s_total", 0.0))
        yield single(DRAIN_LAST_SECONDS, node, snap.get("last_drain_s"))

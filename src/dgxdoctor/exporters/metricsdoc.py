"""Generate docs/metrics.md from the MetricSpec constants: ``python -m dgxdoctor.exporters.metricsdoc``.

Sources: the exporter's own families and every ``MetricSpec`` constant in the module of each registered check.
A test keeps docs/metrics.md equal to this output, so a new metric cannot ship undocumented.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.exporters.collector import NODE_LABEL, OWN_METRICS
from dgxdoctor.exporters.incidents import INCIDENT_METRICS
from dgxdoctor.exporters.readiness import READINESS_METRICS
from dgxdoctor.exporters.remediation import REMEDIATION_METRICS
from dgxdoctor.fleet.compare import IGNORED_FACTS, RULES
from dgxdoctor.result import MetricSpec

HEADER = """# Metrics

Generated from the code by `python -m dgxdoctor.exporters.metricsdoc > docs/metrics.md`; do not edit by hand.

`dgxdoctor run` serves these on `/metrics` (default port 9835, `[daemon] listen` or `--listen HOST:PORT`) and,
when `[daemon] textfile_path` is set, writes the same exposition for node_exporter's textfile collector.
Every series carries a `node` label (the `node` config key, default the hostname). A scrape never runs a
check: it reads the latest result of each. A value a check could not read is absent, never zero.

`dgxdoctor_check_status`: 0 ok, 1 warning, 2 critical, 3 unknown, -1 skipped (the check does not apply on
this node: no such device, not configured). Info metrics (`_info`) are exposed as gauges valued 1.
"""


def all_specs() -> Iterator[tuple[MetricSpec, str]]:
    """Every documented family once, with where it comes from (``dgxdoctor`` or a check name)."""
    seen: set[str] = set()
    for spec in OWN_METRICS:
        seen.add(spec.name)
        yield spec, "dgxdoctor"
    for spec in REMEDIATION_METRICS:
        seen.add(spec.name)
        yield spec, "remediation"
    for spec in INCIDENT_METRICS:
        seen.add(spec.name)
        yield spec, "incidents"
    for spec in READINESS_METRICS:
        seen.add(spec.name)
        yield spec, "readiness"
    for factory in ALL_CHECKS:
        module = sys.modules[factory.__module__]
        for value in vars(module).values():
            if isinstance(value, MetricSpec) and value.name not in seen:
                seen.add(value.name)
                yield value, factory.name


# How each counter (and the histogram) starts after the agent starts. Prometheus's increase() and rate() see no
# increase in a series' first sample: a counter born at 1 hides its first event from every alert on it. So a
# counter exists at 0 for every label value it can take that is known at the start, unless the values are many
# or found only at run time (then no alert uses increase() on it). A counter metric without a line fails
# tests/unit/test_metrics_doc.py.
COLD_START: dict[str, str] = {
    "dgxdoctor_check_runs_total": "0 for every enabled check from its start (one series per check)",
    "dgxdoctor_check_timeouts_total": "0 for every enabled check from its start (one series per check)",
    "dgxdoctor_probe_timeouts_total": "0 for every probe of every enabled check, and `run`, from its start (1-5 "
    "series per check, 32 with every check enabled)",
    "dgxdoctor_logs_signature_matches_total": "0 for every code of the signature catalog from the logs check's "
    "start ({signature_codes} series), whether or not a log file exists yet; a series keeps its last value "
    "through a run that failed",
    "dgxdoctor_remediation_actions_total": "0 for every action and outcome it can count (21 series)",
    "dgxdoctor_remediation_state_invalid_total": "0 from the start (one series)",
    "dgxdoctor_remediation_alerts_dropped_total": "0 from the start (one series)",
    "dgxdoctor_remediation_alerts_held_total": "0 from the start (one series)",
    "dgxdoctor_remediation_fleet_refused_total": "0 from the start (one series)",
    "dgxdoctor_drains_total": "0 for every outcome from the start (5 series)",
    "dgxdoctor_drain_seconds_total": "0 from the start (one series)",
    "dgxdoctor_readiness_changes_total": "0 for every state from the start (5 series)",
    "dgxdoctor_serving_recoveries_total": "0 from the start (one series)",
    "dgxdoctor_serving_recover_seconds_total": "0 from the start (one series)",
    "dgxdoctor_http_bad_requests_total": "0 from the start (one series)",
    "dgxdoctor_write_errors_total": "0 for each file the daemon keeps, from when the daemon sets it up (no alert "
    "reads it)",
    "dgxdoctor_incident_recovery_seconds": "every bucket at 0 from the start",
    "dgxdoctor_http_connections_closed_total": "born at a reason's first close (no alert reads it)",
    "dgxdoctor_event_loop_errors_total": "born at an exception type's first error: the types are open-ended (no "
    "alert reads it)",
    "dgxdoctor_xid_errors_total": "born at its first count: GPUs x catalog XIDs would be ~1,400 series a node; the "
    "XID alerts read the check's findings and `dgxdoctor_xid_last_seen_timestamp_seconds`, born at their first "
    "value",
    "dgxdoctor_nvswitch_sxid_errors_total": "born at its first count (switches x SXIDs found at run time; no alert "
    "reads it)",
    "dgxdoctor_logs_uncatalogued_errors_total": "born at its first count: the source label is the file, unit or "
    "container whose line it counted; shown, never alerted on",
    "dgxdoctor_kernel_events_total": "born at its first count: the device label is found in the line; the kernel "
    "alerts read the xid check's findings",
    "dgxdoctor_kmsg_records_lost_total": "from the xid check's first run, with what left the ring buffer before it "
    "(an increase from 0 would be a false spike)",
    "dgxdoctor_kmsg_records_read_total": "from the xid check's first run",
    "dgxdoctor_gpu_ecc_errors_total": "the driver's own counter, from the first read of the GPU",
    "dgxdoctor_gpu_remapped_rows_total": "the driver's own counter, from the first read of the GPU",
    "dgxdoctor_ib_port_rcv_bytes_total": "the port's own counter, from the first read of the port",
    "dgxdoctor_ib_port_xmit_bytes_total": "the port's own counter, from the first read of the port",
    "dgxdoctor_ib_port_events_total": "the port's own counters, from the first read of the port; the IB alerts "
    "read `dgxdoctor_ib_port_errors_per_second`",
    "dgxdoctor_vllm_preemptions_total": "vLLM's own counter, from the first read of its /metrics",
}

COLD_START_HEADER = """## Counters after a start

`increase()` and `rate()` count no increase in a series' first sample: a counter that appears at 1 hides its first
event from every alert on it (`DgxdoctorNcclFailure`, `DgxdoctorRemediationFailed`). So a counter exists at 0 for
every label value it can take that is known at the start; where the values are many or only found at run time, no
alert uses `increase()` on it. `tests/integration/test_alert_first_event.py` holds every shipped alert to firing
on the first event after a cold start."""


def cold_start_lines() -> list[str]:
    from dgxdoctor.judge.signatures import signature_codes

    lines = ["", COLD_START_HEADER, "", "| Counter | After a start |", "|---|---|"]
    for name, how in COLD_START.items():
        lines.append(f"| `{name}` | {how.format(signature_codes=len(signature_codes()))} |")
    return lines


def render() -> str:
    lines = [HEADER, "| Metric | Type | Labels | Meaning | From |", "|---|---|---|---|---|"]
    mine = ("dgxdoctor", "remediation", "incidents")
    own = [(s, src) for s, src in all_specs() if src in mine]
    checks = sorted((p for p in all_specs() if p[1] not in mine), key=lambda p: p[0].name)
    for spec, source in own + checks:
        labels = ", ".join(f"`{label}`" for label in (NODE_LABEL, *spec.labels))
        meaning = spec.help.replace("|", "\\|")
        lines.append(f"| `{spec.name}` | {spec.type} | {labels} | {meaning} | {source} |")
    lines += cold_start_lines()
    lines += [
        "",
        INCIDENT_NOTE,
        "",
        PEER_HEADER,
        "",
        "| `metric` | Compares | Per | Tolerance | Odd node | Finding |",
        "|---|---|---|---|---|---|",
    ]
    for rule in RULES:
        per = "rail (`device/port`)" if rule.per_rail else "node"
        odd = "lowest" if rule.bad == "low" else "highest"
        compares = f"{rule.aggregate} of `{rule.metric}`"
        lines.append(f"| `{rule.key}` | {compares} | {per} | {rule.tolerance:g} | {odd} | `{rule.code}` |")
    lines += ["", DRIFT_TEXT.format(ignored=", ".join(f"`{k}`" for k in sorted(IGNORED_FACTS)))]
    return "\n".join(lines) + "\n"


DRIFT_TEXT = """While any node's vllm check sees the engine stalled (`ENGINE_NO_PROGRESS`, `ENGINE_HUNG`), a hang on
one node shows on both; the GPUs tell which: the one node whose GPUs are idle (mean utilisation below 10%) while
the others' spin in the collective (90% or more) is `PEER_TP_RANK_STOPPED` (critical), the node where the
tensor-parallel rank stopped. When a node's ras check reports a rank NCCL's RAS finds unresponsive or dead
(`dgxdoctor_ras_rank_problem_since_timestamp_seconds`), the comparison joins it with that rank's GPU and its node's
rails instead, in one `PEER_TP_RANK_STUCK` (critical) naming the rank, node, GPU and rail, and saying where the
views disagree (docs/checks/ras.md).

Node facts (`dgxdoctor_node_fact_info`) are compared as well. A fact present on several nodes with different values
is one finding, the same whichever node compares. It names an odd node only where one exists: three or more nodes,
more than half of them agreeing; the subject is then the node(s) off that value ("x: dgx-c has B where the other 2
nodes (dgx-a, dgx-b) have A"). Two nodes that differ, or no value held by a majority, name none: the subject is
empty and the message gives every node's value ("the nodes disagree on x: dgx-a A, dgx-b B"). The codes:
`PEER_MODEL_MISMATCH` (critical: model fingerprint, files, shard hashes), `PEER_NCCL_ENV_DRIFT` (an `nccl_env.*`
variable differs or is set on one node only), `PEER_VERSION_SKEW` (critical for the driver, CUDA and NCCL versions,
warning for the kernel, vLLM, Ray, torch, Python and dgxdoctor's own release, `dgxdoctor_version`, taken from each
node's results document), `PEER_HARDWARE_DRIFT` (GPU, IB, topology, memory facts),
`PEER_RAS_VIEW_DRIFT` (the `ras.*` facts: the serving communicator each node's NCCL RAS sees) and `PEER_FACT_DRIFT`
for any other fact. Ignored, because they differ by design: {ignored}."""

INCIDENT_NOTE = """## Incidents

An incident runs from the first CRITICAL result of any check on the node (`peer_compare` aside: the other node's
incident is that node's) to the first good completion after it: a run of the `vllm` check that is not CRITICAL and
whose canary completed; on a node serving no completion (a Ray worker) to the first moment no check is CRITICAL.
Each is one line in `<state_dir>/incidents.jsonl` (detection time, problem, action taken, recovery time), read back at
start. Serving MTTR over a day: `increase(dgxdoctor_incident_recovery_seconds_sum[1d]) /
increase(dgxdoctor_incident_recovery_seconds_count[1d])`; alert on a short time between incidents with
`dgxdoctor_incident_since_last_seconds < 3600`."""

PEER_HEADER = """## Values of `metric` in `dgxdoctor_peer_imbalance_ratio`

Each compares one value per node (or per rail) between this node and its peers: imbalance = (max - min) / max.
Above the tolerance (`[checks.peer_compare] tolerances`), and when some node is above the metric's floor, the
`peer_compare` check reports a finding naming the odd node: the one with the lowest or highest value, the
direction that hurts (an idle node, a hot one, a rail with errors); with three nodes or more, every node as far off
the best value (beyond the tolerance) on that side. Every node that compares names the same ones."""


if __name__ == "__main__":
    sys.stdout.write(render())

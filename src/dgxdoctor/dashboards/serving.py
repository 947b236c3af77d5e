"""Serving: vLLM's own metrics next to the hardware state of the same nodes, on one time axis.

vLLM's series carry no ``node`` label of their own: the Prometheus job that scrapes vLLM attaches it
(docs/dashboards.md shows the scrape configuration), so ``node=~"$node"`` selects vLLM and dgxdoctor alike.
Both generations of vLLM's names are read: ``vllm:kv_cache_usage_perc`` (V1 engine) and the older
``vllm:gpu_cache_usage_perc``; ``vllm:inter_token_latency_seconds`` and the older
``vllm:time_per_output_token_seconds``. An aggregation drops the name, so ``or`` keeps one of each.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog import builder as cog_builder
from grafana_foundation_sdk.models import dashboard as dash

from dgxdoctor.dashboards.common import frame
from dgxdoctor.dashboards.overview import RAIL, STATUS
from dgxdoctor.dashboards.panels import (
    NODE,
    STATUS_MAPPINGS,
    UP_MAPPINGS,
    Q,
    row,
    stat,
    state_timeline,
    thresholds,
    timeseries,
)

UID = "dgxdoctor-serving"
TITLE = "dgxdoctor / Serving"

Panels = list[cog_builder.Builder[dash.Panel] | dash_b.Row]

# The runbook: KV cache usage above 0.9 means requests will queue and be preempted.
KV_CACHE_LIMIT = 0.9
# vllm check's ttft_p99_jump_factor default: a P99 this many times its baseline is a WARNING.
TTFT_JUMP_FACTOR = 3.0
# The TTFT P99 baseline: the P99 over the last day (the vllm check uses the P99 before its window).
BASELINE_RANGE = "1d"

# Newer name first: where a release exports both, the newer one wins.
GENERATIONS: dict[str, str] = {
    "vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc",
    "vllm:inter_token_latency_seconds_bucket": "vllm:time_per_output_token_seconds_bucket",
}


def both(template: str, name: str) -> str:
    """``template`` (with ``{m}`` for the metric) over both generations of ``name``, joined by ``or``."""
    old = GENERATIONS[name]
    return f"{template.format(m=name)} or {template.format(m=old)}"


def quantile(q: float, bucket: str, rng: str = "$__rate_interval") -> str:
    return f"histogram_quantile({q}, sum by (node, le) (rate({bucket}{{{NODE}}}[{rng}])))"


def quantile_both(q: float, bucket: str) -> str:
    old = GENERATIONS[bucket]
    inner = f"rate({bucket}{{{NODE}}}[$__rate_interval]) or rate({old}{{{NODE}}}[$__rate_interval])"
    return f"histogram_quantile({q}, sum by (node, le) ({inner}))"


def latency(title: str, what: str, bucket: str, todo: str) -> cog_builder.Builder[dash.Panel]:
    if bucket in GENERATIONS:
        p50, p99 = quantile_both(0.5, bucket), quantile_both(0.99, bucket)
    else:
        p50, p99 = quantile(0.5, bucket), quantile(0.99, bucket)
    return timeseries(
        title,
        f"{what}, P50 and P99 from vLLM's histogram ({bucket.removesuffix('_bucket')}). {todo}",
        [Q(p50, "{{node}} P50"), Q(p99, "{{node}} P99")],
        "s",
        width=8,
    )


def vllm() -> Panels:
    kv = both(f"max by (node, model_name) ({{m}}{{{{{NODE}}}}})", "vllm:kv_cache_usage_perc")
    return [
        row("vLLM"),
        state_timeline(
            "vLLM up (agent's /health probe)",
            "Whether vLLM's /health answered 200 to the node's agent. DOWN while the process runs: loading or "
            "hung (the vllm check tells which); DOWN with no process: it died, read its log and the XID panel.",
            [Q(f"max by (node) (dgxdoctor_vllm_up{{{NODE}}})", "{{node}}")],
            UP_MAPPINGS,
            width=12,
            height=5,
        ),
        timeseries(
            "Seconds since the engine made progress",
            "Seconds since vLLM's engine last made a step while requests were running or waiting (0 when idle). Red "
            "past the vllm check's stall_s default (15 s): the engine is hung; compare both nodes' GPUs, collect "
            "`py-spy dump` of the EngineCore and restart vLLM (remediation does it in act mode).",
            [Q(f"max by (node) (dgxdoctor_vllm_seconds_since_progress{{{NODE}}})", "{{node}}")],
            "s",
            steps=thresholds((None, "green"), (2, "yellow"), (15, "red")),
            lines=True,
            width=12,
            height=5,
        ),
        timeseries(
            "KV cache usage",
            "Share of the KV cache blocks in use (vllm:kv_cache_usage_perc, formerly vllm:gpu_cache_usage_perc). "
            "Above 0.9 (the runbook's limit, dashed red) new requests wait and running ones are preempted: lower "
            "--max-num-seqs, shorten --max-model-len, raise --gpu-memory-utilization, or add capacity.",
            [Q(kv, "{{node}} {{model_name}}")],
            "percentunit",
            steps=thresholds((None, "green"), (KV_CACHE_LIMIT, "red")),
            min_val=0,
            max_val=1,
            lines=True,
            width=8,
        ),
        timeseries(
            "Requests running and waiting",
            "Requests in the engine and queued for it. A queue that stays above zero means the server is at "
            "capacity (KV cache or --max-num-seqs): the runbook's concurrency knee. Waiting with nothing running "
            "is a hung engine.",
            [
                Q(f"sum by (node) (vllm:num_requests_running{{{NODE}}})", "{{node}} running"),
                Q(f"sum by (node) (vllm:num_requests_waiting{{{NODE}}})", "{{node}} waiting"),
            ],
            "short",
            width=8,
        ),
        timeseries(
            "Preemptions",
            "Requests preempted per interval because the KV cache was full: their work is redone later, "
            "latency jumps. Any sustained rate: see the KV cache panel.",
            [Q(f"sum by (node) (increase(vllm:num_preemptions_total{{{NODE}}}[$__rate_interval]))", "{{node}}")],
            "short",
            steps=thresholds((None, "green"), (1, "red")),
            width=8,
        ),
    ]


def latencies() -> Panels:
    ttft99 = quantile(0.99, "vllm:time_to_first_token_seconds_bucket")
    base99 = quantile(0.99, "vllm:time_to_first_token_seconds_bucket", BASELINE_RANGE)
    return [
        latency(
            "Time to first token",
            "Time to first token (TTFT)",
            "vllm:time_to_first_token_seconds_bucket",
            "A P99 jump with a full KV cache or a queue is load; with neither, look at the hardware rows below.",
        ),
        timeseries(
            "TTFT P99 against its baseline",
            f"The TTFT P99 now divided by the P99 over the last {BASELINE_RANGE} (the baseline). Above "
            f"{TTFT_JUMP_FACTOR:g} (dashed red; the vllm check's ttft_p99_jump_factor) first tokens are much slower "
            "than usual: if load did not rise, compare with the XID annotations and the rails below, then run the "
            "runbook's 100-request benchmark against its recorded baseline.",
            [Q(f"({ttft99}) / ({base99})", "{{node}}")],
            "none",
            steps=thresholds((None, "green"), (TTFT_JUMP_FACTOR, "red")),
            lines=True,
            width=8,
        ),
        latency(
            "Time per output token",
            "Mean time per output token of each request (TPOT)",
            "vllm:request_time_per_output_token_seconds_bucket",
            "A rise on one node only (with TP across nodes, both move together) or with IB errors points at the "
            "fabric.",
        ),
        latency(
            "Inter-token latency",
            "Time between two tokens of a request (vllm:inter_token_latency_seconds, formerly "
            "vllm:time_per_output_token_seconds)",
            "vllm:inter_token_latency_seconds_bucket",
            "Every decode step is an all-reduce across both nodes: a jump with flat load is the network or a "
            "throttled GPU.",
        ),
        latency(
            "End-to-end request latency",
            "Request latency from arrival to the last token",
            "vllm:e2e_request_latency_seconds_bucket",
            "Compare with the queue time: most of it waiting means capacity, not speed.",
        ),
        latency(
            "Queue time",
            "Time requests waited before the engine scheduled them",
            "vllm:request_queue_time_seconds_bucket",
            "Above a few seconds the server is saturated: the runbook's concurrency sweep finds the knee.",
        ),
    ]


def throughput() -> Panels:
    return [
        timeseries(
            "Token throughput",
            "Prompt tokens processed and tokens generated per second. The runbook's target for this deployment is "
            "600+ output tokens/s at the chosen concurrency; a drop at the same load is a slowdown.",
            [
                Q(f"sum by (node) (rate(vllm:prompt_tokens_total{{{NODE}}}[$__rate_interval]))", "{{node}} prompt"),
                Q(
                    f"sum by (node) (rate(vllm:generation_tokens_total{{{NODE}}}[$__rate_interval]))",
                    "{{node}} generation",
                ),
            ],
            "suffix:tok/s",
            width=12,
        ),
        timeseries(
            "Requests finished by reason",
            "Requests completed per second by finish reason (stop, length, abort). Aborts climbing: clients time "
            "out, usually because latency rose.",
            [
                Q(
                    f"sum by (node, finished_reason) (rate(vllm:request_success_total{{{NODE}}}[$__rate_interval]))",
                    "{{node}} {{finished_reason}}",
                )
            ],
            "reqps",
            width=12,
        ),
    ]


OPEN_MAPPINGS: list[dash.ValueMapping] = [
    dash.ValueMap(
        options={
            "0": dash.ValueMappingResult(text="none open", color="green", index=0),
            "1": dash.ValueMappingResult(text="OPEN", color="red", index=1),
        }
    )
]
# MTTR and incident counts over this range: one day shows a shift's incidents.
INCIDENT_RANGE = "1d"


def incidents() -> Panels:
    """Serving MTTR and the time between incidents (fleet.incidents: first detection to first good completion)."""
    rec = "dgxdoctor_incident_recovery_seconds"
    per_node = "sum by (node) (increase({m}{{" + NODE + "}}[" + INCIDENT_RANGE + "]))"
    return [
        row("Incidents"),
        stat(
            "Incident open",
            "An incident runs from the first CRITICAL result of a node to the first good completion after it (the "
            "vllm check's canary). OPEN: serving has not recovered yet.",
            [Q(f"dgxdoctor_incident_open{{{NODE}}}", "{{node}}")],
            "none",
            mappings=OPEN_MAPPINGS,
            width=6,
        ),
        stat(
            "Time since the last incident",
            "Since the last incident was detected on each node (the time between incidents; alert on it being "
            "short). No value: no incident recorded on that node.",
            [Q(f"dgxdoctor_incident_since_last_seconds{{{NODE}}}", "{{node}}")],
            "s",
            no_value="no incident yet",
            width=6,
        ),
        timeseries(
            f"Recovery time (MTTR over {INCIDENT_RANGE})",
            "Mean and P90 time from detection to the first good completion, over the incidents of the last day. "
            "A rising MTTR: restarts take longer (model "
            "load, Ray rejoin) or need an operator.",
            [
                Q(f"{per_node.format(m=rec + '_sum')} / {per_node.format(m=rec + '_count')}", "{{node}} mean"),
                Q(
                    f"histogram_quantile(0.9, sum by (node, le) (increase({rec}_bucket{{{NODE}}}[{INCIDENT_RANGE}])))",
                    "{{node}} P90",
                ),
            ],
            "s",
            width=12,
        ),
    ]


ROTATION_MAPPINGS: list[dash.ValueMapping] = [
    dash.ValueMap(
        options={
            "0": dash.ValueMappingResult(text="OUT", color="red", index=0),
            "1": dash.ValueMappingResult(text="IN", color="green", index=1),
        }
    )
]


def _drain_panels(per_node: str) -> Panels:
    """The drains before restarts and the time to recover: their means and their last values."""
    return [
        timeseries(
            f"Drain and time to recover (mean over {INCIDENT_RANGE})",
            "Mean drain before a restart (out of rotation until vLLM's requests reached 0) and mean time from "
            "leaving rotation to ready again. A drain near drain_timeout_s: the balancer kept sending (check its "
            "agent-check or probe period).",
            [
                Q(
                    f"{per_node.format(m='dgxdoctor_drain_seconds_total')} / "
                    f"{per_node.format(m='dgxdoctor_drains_total')}",
                    "{{node}} drain",
                ),
                Q(
                    f"{per_node.format(m='dgxdoctor_serving_recover_seconds_total')} / "
                    f"{per_node.format(m='dgxdoctor_serving_recoveries_total')}",
                    "{{node}} recover",
                ),
            ],
            "s",
            min_val=0,
            width=8,
        ),
        timeseries(
            "Last drain and last recovery",
            "The last drain's duration and the last incident's time from leaving rotation to ready again, per "
            "node; a step up after a release or a driver change shows here first.",
            [
                Q(f"dgxdoctor_drain_last_seconds{{{NODE}}}", "{{node}} last drain"),
                Q(f"dgxdoctor_serving_last_recover_seconds{{{NODE}}}", "{{node}} last recovery"),
            ],
            "s",
            min_val=0,
            width=8,
        ),
    ]


def rotation() -> Panels:
    """The readiness signal a balancer reads (GET /ready, HAProxy's agent) and the drains before restarts."""
    per_node = "sum by (node) (increase({m}{{" + NODE + "}}[" + INCIDENT_RANGE + "]))"
    return [
        row("Rotation"),
        state_timeline(
            "In the balancer's rotation",
            "GET /ready 200 (IN) or 503 (OUT) per node: OUT while vLLM is dead or hung, the engine makes no "
            "progress (suspect), a hardware cause or a peer is down, or a restart drains and runs. A node OUT "
            "for long with nothing in the remediation audit needs a person.",
            [Q(f"dgxdoctor_ready{{{NODE}}}", "{{node}}")],
            ROTATION_MAPPINGS,
            height=5,
        ),
        timeseries(
            f"Readiness changes (over {INCIDENT_RANGE})",
            "Times each node became each state (suspect, draining, restarting, down, ready). Suspect without "
            "restarts: long prefills or stalls that resolved; many downs: look at the checks and the audit.",
            [
                Q(
                    f"sum by (node, state) (increase(dgxdoctor_readiness_changes_total{{{NODE}}}[{INCIDENT_RANGE}]))",
                    "{{node}} {{state}}",
                )
            ],
            "none",
            min_val=0,
            width=8,
        ),
        *_drain_panels(per_node),
    ]


def hardware() -> Panels:
    per_gpu = "{{node}} GPU {{gpu}}"
    return [
        row("The same nodes' hardware"),
        state_timeline(
            "Check status",
            "dgxdoctor's checks on the selected nodes, on the same time axis as the latency panels: a latency "
            "spike that starts with a check turning red has found its cause.",
            [Q(STATUS, "{{node}} {{check}}")],
            STATUS_MAPPINGS,
            height=8,
        ),
        timeseries(
            "GPU utilisation",
            "Per GPU of each node. Under load all GPUs of both nodes work together; a GPU or node idle while the "
            "others work is a lost rank.",
            [Q(f"dgxdoctor_gpu_utilization_ratio{{{NODE}}}", per_gpu)],
            "percentunit",
            min_val=0,
            max_val=1,
            width=8,
        ),
        timeseries(
            "GPU temperature margin",
            "Degrees below the GPU's maximum operating temperature; near 0 the clocks drop and every token slows.",
            [Q(f"dgxdoctor_gpu_temperature_margin_celsius{{{NODE}}}", per_gpu)],
            "celsius",
            steps=thresholds((None, "red"), (5, "yellow"), (15, "green")),
            lines=True,
            width=8,
        ),
        timeseries(
            "IB error counter rates",
            "RDMA error counters per rail: errors here during a TPOT or TTFT spike point at the cable or port of "
            "that rail.",
            [
                Q(
                    f"sum by (node, device, port) (dgxdoctor_ib_port_errors_per_second{{{NODE}}})",
                    RAIL,
                )
            ],
            "cps",
            steps=thresholds((None, "green"), (1e-9, "red")),
            width=8,
        ),
    ]


def build() -> dash_b.Dashboard:
    board = frame(
        TITLE,
        UID,
        "vLLM's own metrics (queue, KV cache, TTFT, TPOT, end-to-end latency, throughput, preemptions) next to the "
        "hardware state of the same nodes; XIDs mark the time axis.",
        ["dgxdoctor", "vllm"],
    )
    for section in (vllm, latencies, throughput, incidents, rotation, hardware):
        for item in section():
            board = board.with_row(item) if isinstance(item, dash_b.Row) else board.with_panel(item)
    return board

"""The cluster overview: both nodes side by side, every check, the hardware, the fabric and the agent itself."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog import builder as cog_builder
from grafana_foundation_sdk.models import dashboard as dash

from dgxdoctor.dashboards.common import deviation_records, frame
from dgxdoctor.dashboards.panels import (
    NODE,
    STATUS_MAPPINGS,
    UP_MAPPINGS,
    Q,
    row,
    stat,
    state_timeline,
    table,
    thresholds,
    timeseries,
    transform,
)
from dgxdoctor.fleet.compare import IGNORED_FACTS

UID = "dgxdoctor-overview"
TITLE = "dgxdoctor / Cluster overview"

Panels = list[cog_builder.Builder[dash.Panel] | dash_b.Row]

# The serving nodes must share every fact except these, which differ by design (fleet.compare.IGNORED_FACTS).
_IGNORED = "|".join(sorted(IGNORED_FACTS)).replace(".", "\\\\.")
FACT = f'dgxdoctor_node_fact_info{{{NODE}, key!~"{_IGNORED}"}}'
DISTINCT_VALUES = f"count by (key) (count by (key, value) ({FACT}))"
STATUS = f"max by (node, check) (dgxdoctor_check_status{{{NODE}}})"
RED_ABOVE_ZERO = thresholds((None, "green"), (1e-9, "red"))
PER_GPU = "{{node}} GPU {{gpu}}"


def health() -> Panels:
    return [*_check_health(), *_alerts_and_timing()]


def _check_health() -> Panels:
    return [
        row("Health: every check on every node"),
        table(
            "Check status (node × check)",
            "Latest status of every check on every node: OK green, WARNING yellow, CRITICAL red, UNKNOWN purple, "
            "SKIPPED blue (the check does not apply on that node, never OK). When a cell turns red or purple: run "
            "`dgxdoctor check --only CHECK` on that node (or read its `/state`): the findings name the device and "
            "the remedy. An empty cell: the check did not run there.",
            [Q(STATUS)],
            mappings=STATUS_MAPPINGS,
            transformations=[
                transform("groupingToMatrix", {"columnField": "check", "rowField": "node", "valueField": "Value"}),
            ],
            colour_cells=True,
            no_value="not run",
            width=24,
            height=6,
        ),
        state_timeline(
            "Check status over time",
            "The same status per node and check along the time axis: when did it turn, and did both nodes turn "
            "together (a shared cause: fabric, Ray head, model files) or one alone (that node's hardware).",
            [Q(STATUS, "{{node}} {{check}}")],
            STATUS_MAPPINGS,
            height=10,
        ),
    ]


def _alerts_and_timing() -> Panels:
    return [
        table(
            "Alerts from the shipped rules",
            "dgxdoctor's alert rules (src/dgxdoctor/alerts/) pending or firing in this Prometheus, per node. Each "
            "alert's description says what to do; alerts labelled dgxdoctor_action are the ones remediation acts "
            "on. Empty: nothing fires.",
            [Q(f"max by (node, alertname, alertstate, severity) (ALERTS{{{NODE}}})")],
            transformations=[transform("organize", {"excludeByName": {"Time": True, "Value": True}})],
            no_value="no alert",
            width=24,
            height=5,
        ),
        timeseries(
            "Seconds since each check last ran",
            "Age of every check's latest result. Above 900 s the agent is not scheduling it (agent stuck or "
            "stopped): `systemctl status dgxdoctor` and `journalctl -u dgxdoctor` on that node.",
            [
                Q(
                    f"time() - max by (node, check) (dgxdoctor_check_last_run_timestamp_seconds{{{NODE}}})",
                    "{{node}} {{check}}",
                )
            ],
            "s",
            steps=thresholds((None, "green"), (900, "red")),
            lines=True,
        ),
        timeseries(
            "Check timeouts and probe timeouts",
            "Check runs and single probes (an NVML call, a command, an HTTP request) that did not answer within "
            "their timeout. A hang is itself a fault: an NVML call that hangs often means a GPU fell off the bus; "
            "look at that node's XIDs and `nvidia-smi`.",
            [
                Q(
                    f"sum by (node, check) (increase(dgxdoctor_check_timeouts_total{{{NODE}}}[$__rate_interval]))",
                    "{{node}} {{check}}",
                ),
                Q(
                    f"sum by (node, check, probe) "
                    f"(increase(dgxdoctor_probe_timeouts_total{{{NODE}}}[$__rate_interval]))",
                    "{{node}} {{check}}/{{probe}}",
                ),
            ],
            "short",
            steps=RED_ABOVE_ZERO,
        ),
    ]


def peers() -> Panels:
    return [*_peers_and_drift(), *_peer_balance()]


def _peers_and_drift() -> Panels:
    return [
        row("Peers, drift and imbalance between the nodes"),
        state_timeline(
            "Peers up",
            "Whether each node's agent reached its peer's `/state` in the last comparison cycle. DOWN on one side "
            "only: a firewall or routing problem between the nodes; on both sides: the link between them. Check "
            "the peer's agent (`curl http://PEER:9835/healthz`) and the network before the serving path.",
            [Q(f"max by (node, peer) (dgxdoctor_peer_up{{{NODE}}})", "{{node}} → {{peer}}")],
            UP_MAPPINGS,
            width=12,
            height=6,
        ),
        stat(
            "Facts that differ between nodes",
            "Node facts (driver, CUDA, NCCL, kernel, vLLM, Ray, torch, Python versions, NCCL environment, model "
            "fingerprint) with more than one value across the selected nodes. Red: the nodes are not identical; "
            "the table below names the fact, and `peer_compare`'s findings name the odd node. Align the versions "
            "before restarting the serving stack.",
            [Q(f"count(({DISTINCT_VALUES}) > 1) or vector(0)", "facts differing")],
            "short",
            steps=RED_ABOVE_ZERO,
            width=4,
            height=6,
        ),
        table(
            "Software versions per node",
            "dgxdoctor_node_info: what each node runs. Every column must read the same on both nodes "
            "(empty: not detected).",
            [
                Q(
                    f"max by (node, kernel_release, vllm_version, ray_version, torch_version, nccl_version, "
                    f"python_version) (dgxdoctor_node_info{{{NODE}}})"
                )
            ],
            transformations=[transform("organize", {"excludeByName": {"Time": True, "Value": True}})],
            width=8,
            height=6,
        ),
    ]


def _peer_balance() -> Panels:
    return [
        table(
            "Differing facts",
            "Each fact that has more than one value, with the value on each node. Empty when the nodes agree.",
            [Q(f"max by (node, key, value) ({FACT}) and on (key) (({DISTINCT_VALUES}) > 1)")],
            transformations=[transform("organize", {"excludeByName": {"Time": True, "Value": True}})],
            no_value="no drift",
            width=12,
            height=6,
        ),
        timeseries(
            "Deviation from the cluster median (recording rules)",
            "Each node's (and each IB rail's) deviation from the median of all nodes: (node - median) / median, "
            "computed by the shipped recording rules. 0: like the others; -0.5: half the median (an idle or slow "
            "node: uneven sharding, a slow rail); +0.5: 1.5 times it (a hot GPU, a rail with errors). Beyond ±0.5 "
            "open the matching panel below for that node.",
            [Q(f"{name}{{{NODE}}}", _deviation_legend(name)) for name in deviation_records()],
            "percentunit",
            steps=thresholds((None, "red"), (-0.5, "green"), (0.5, "red")),
            lines=True,
        ),
        timeseries(
            "Imbalance between the nodes (agent's comparison)",
            "The agents' own two-node comparison: (max - min) / max of each compared metric over a node and its "
            "peers (0 balanced, 1 one side idle). Above the metric's tolerance (docs/metrics.md) `peer_compare` "
            "names the odd node and the likely cause in its findings.",
            [
                Q(
                    f"max by (node, metric, rail) (dgxdoctor_peer_imbalance_ratio{{{NODE}}})",
                    "{{node}} {{metric}} {{rail}}",
                )
            ],
            "percentunit",
            steps=thresholds((None, "green"), (0.5, "red")),
            min_val=0,
            max_val=1,
            lines=True,
        ),
    ]


def _deviation_legend(record: str) -> str:
    level, metric, _ = record.split(":")
    what = metric.removeprefix("dgxdoctor_")
    return f"{{{{node}}}} {{{{device}}}}/{{{{port}}}} {what}" if level == "node_rail" else f"{{{{node}}}} {what}"


def gpus() -> Panels:
    return [*_gpu_load(), *_gpu_thermal_and_power(), *_gpu_clocks_and_links()]


def _gpu_load() -> Panels:
    return [
        row("GPUs per node"),
        timeseries(
            "GPU utilisation",
            "Fraction of time a kernel ran, per GPU. Serving with tensor parallelism keeps all 16 GPUs of both "
            "nodes busy together: one node idle while the other works means its ranks are stuck or gone (check "
            "Ray and the XID panel); all idle under load means the engine is hung (Serving dashboard).",
            [Q(f"dgxdoctor_gpu_utilization_ratio{{{NODE}}}", PER_GPU)],
            "percentunit",
            min_val=0,
            max_val=1,
            width=6,
        ),
        timeseries(
            "GPU memory used",
            "Framebuffer in use over total, per GPU. vLLM reserves the same share on every GPU "
            "(--gpu-memory-utilization): a GPU far below the others has lost its worker. Near 1.0 outside vLLM's "
            "reservation: another process holds memory (`nvidia-smi`).",
            [Q(f"dgxdoctor_gpu_memory_used_bytes{{{NODE}}} / dgxdoctor_gpu_memory_total_bytes{{{NODE}}}", PER_GPU)],
            "percentunit",
            min_val=0,
            max_val=1,
            width=6,
        ),
    ]


def _gpu_thermal_and_power() -> Panels:
    return [
        timeseries(
            "GPU temperature margin",
            "Degrees left below the GPU's maximum operating temperature (nvidia-smi T.Limit). At 0 the clocks drop. "
            "Red below 5 °C: check the airflow and fans of that chassis, and the clock-event panel.",
            [Q(f"dgxdoctor_gpu_temperature_margin_celsius{{{NODE}}}", PER_GPU)],
            "celsius",
            steps=thresholds((None, "red"), (5, "yellow"), (15, "green")),
            lines=True,
            width=6,
        ),
        timeseries(
            "GPU temperature",
            "GPU core temperature. Compare the nodes: one chassis running hotter under the same load points at "
            "its cooling.",
            [Q(f"dgxdoctor_gpu_temperature_celsius{{{NODE}}}", PER_GPU)],
            "celsius",
            width=6,
        ),
        timeseries(
            "GPU power draw and limit",
            "Power per GPU against the enforced limit. Draw pinned at the limit with clock events: power capping; "
            "a limit below the default: someone lowered it (`nvidia-smi -q -d POWER`).",
            [
                Q(f"dgxdoctor_gpu_power_watts{{{NODE}}}", PER_GPU),
                Q(f"max by (node) (dgxdoctor_gpu_power_limit_watts{{{NODE}}})", "{{node}} limit"),
            ],
            "watt",
            width=8,
        ),
    ]


def _gpu_clocks_and_links() -> Panels:
    return [
        timeseries(
            "Clock events holding clocks down",
            "GPUs whose clocks are held down, by reason (thermal, power brake, HW slowdown). Sustained thermal or "
            "power-brake events slow the whole tensor-parallel group to the slowest GPU: fix the cooling or the "
            "power supply of that node.",
            [
                Q(
                    f"sum by (node, reason) (dgxdoctor_gpu_clock_event_active{{{NODE}}})",
                    "{{node}} {{reason}}",
                )
            ],
            "short",
            steps=RED_ABOVE_ZERO,
            width=8,
        ),
        table(
            "NVLink and GPU health",
            "Per GPU: active NVLink links (all must be up; a GPU with fewer than its peers needs a reset or a field "
            "check: `nvidia-smi nvlink -s`), uncorrected volatile ECC errors, a pending row remap, and the recovery "
            "action the driver asks for (0 none, 1 GPU reset, 2 node reboot, 3/4 drain). Anything but 0 in the "
            "last three columns: drain the node and do what the recovery column says.",
            [
                Q(f"max by (node, gpu, pci_bus_id) (dgxdoctor_gpu_nvlink_links_up{{{NODE}}})"),
                Q(
                    f"max by (node, gpu, pci_bus_id) "
                    f'(dgxdoctor_gpu_ecc_errors_total{{{NODE}, error="uncorrected", scope="volatile"}})'
                ),
                Q(f"max by (node, gpu, pci_bus_id) (dgxdoctor_gpu_row_remap_pending{{{NODE}}})"),
                Q(f"max by (node, gpu, pci_bus_id) (dgxdoctor_gpu_recovery_action{{{NODE}}})"),
            ],
            transformations=[
                transform("merge", {}),
                transform(
                    "organize",
                    {
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            "Value #A": "NVLinks up",
                            "Value #B": "uncorrected ECC",
                            "Value #C": "row remap pending",
                            "Value #D": "recovery action",
                        },
                    },
                ),
            ],
            width=8,
        ),
    ]


XID_WITH_CLASS = (
    f"dgxdoctor_xid_errors_total{{{NODE}}} * on (node, xid) group_left (resolution, name) "
    f"dgxdoctor_xid_catalog_info{{{NODE}}}"
)


def xids() -> Panels:
    return [
        row("XID and SXID errors"),
        table(
            "XIDs by resolution class",
            "Every XID seen since the agent started, per GPU (PCI bus id), with NVIDIA's resolution bucket: "
            "RESTART_APP (the serving process; vLLM usually dies with it), RESET_GPU (drain, `nvidia-smi -r`), "
            "RESTART_BM (drain and reboot the node; XID 79 may need the GPU reseated), CONTACT_SUPPORT "
            "(`nvidia-bug-report.sh`, open a case), IGNORE. Act on the worst class present.",
            [Q(f"max by (node, pci_bus_id, xid, name, resolution) ({XID_WITH_CLASS})")],
            transformations=[
                transform(
                    "organize",
                    {"excludeByName": {"Time": True}, "renameByName": {"Value": "count", "pci_bus_id": "GPU"}},
                )
            ],
            no_value="no XID",
            width=12,
        ),
        timeseries(
            "New XIDs per resolution class",
            "XIDs counted in each interval, by node and resolution class; the same instants mark every panel "
            "(annotation 'XID errors'). A burst on one node next to a latency spike on the Serving dashboard is "
            "that node's GPU.",
            [
                Q(
                    f"sum by (node, resolution) (increase(dgxdoctor_xid_errors_total{{{NODE}}}[$__rate_interval]) "
                    f"* on (node, xid) group_left (resolution) dgxdoctor_xid_catalog_info{{{NODE}}})",
                    "{{node}} {{resolution}}",
                )
            ],
            "short",
            steps=RED_ABOVE_ZERO,
            width=12,
        ),
        table(
            "NVSwitch SXIDs",
            "NVSwitch errors since the agent started, per switch and SXID. A fatal SXID breaks NVLink for every "
            "GPU behind the switch: drain the node, restart Fabric Manager or reboot, and open a case if it "
            "recurs.",
            [Q(f"max by (node, pci_bus_id, sxid) (dgxdoctor_nvswitch_sxid_errors_total{{{NODE}}})")],
            transformations=[
                transform("organize", {"excludeByName": {"Time": True}, "renameByName": {"Value": "count"}})
            ],
            no_value="no SXID",
            width=12,
            height=6,
        ),
        stat(
            "Kernel log records lost",
            "Kernel log records overwritten before the agent read them: XIDs may have been missed. Red: read "
            "`dmesg` on that node by hand and consider a larger log buffer (log_buf_len).",
            [Q(f"max by (node) (dgxdoctor_kmsg_records_lost_total{{{NODE}}})", "{{node}}")],
            "short",
            steps=RED_ABOVE_ZERO,
            width=12,
            height=6,
        ),
    ]


RAIL = "{{node}} {{device}}/{{port}}"


def infiniband() -> Panels:
    return [
        row("InfiniBand / RoCE rails"),
        state_timeline(
            "Link state per rail",
            "Each RDMA port: UP when Active with physical state LinkUp. A rail DOWN on one node halves or stops "
            "NCCL traffic between the nodes: `ibstat DEVICE` there, then the cable, the transceiver and the switch "
            "port. A restart of vLLM cannot fix a link.",
            [Q(f"max by (node, device, port) (dgxdoctor_ib_port_up{{{NODE}}})", RAIL)],
            UP_MAPPINGS,
            width=12,
        ),
        table(
            "Rails: rate and flaps",
            "Negotiated rate per rail (all rails of both nodes must match: 400 Gb/s on NDR) and link flaps within "
            "the flap window (2 or more: reseat or replace the cable).",
            [
                Q(f"max by (node, device, port) (dgxdoctor_ib_port_rate_gbps{{{NODE}}})"),
                Q(f"max by (node, device, port) (dgxdoctor_ib_port_link_flaps{{{NODE}}})"),
            ],
            transformations=[
                transform("merge", {}),
                transform(
                    "organize",
                    {
                        "excludeByName": {"Time": True},
                        "renameByName": {"Value #A": "rate Gb/s", "Value #B": "flaps"},
                    },
                ),
            ],
            width=12,
        ),
        timeseries(
            "Error counter rates per rail",
            "Increase per second of each RDMA error counter between the agent's last two reads. Symbol and "
            "link-integrity errors: the physical link (cable, transceiver); receive errors and transmit discards: "
            "congestion or a bad port. NVIDIA's limits are in the alert rules; compare the rail with the same rail "
            "on the other node.",
            [
                Q(
                    f"sum by (node, device, port, counter) (dgxdoctor_ib_port_errors_per_second{{{NODE}}})",
                    "{{node}} {{device}}/{{port}} {{counter}}",
                )
            ],
            "cps",
            steps=RED_ABOVE_ZERO,
        ),
        timeseries(
            "Throughput per rail",
            "Bytes per second received (negative) and sent per rail. Under load every rail of both nodes should "
            "carry a similar share: a rail far below its peers is slow or unused (NCCL_IB_HCA).",
            [
                Q(f"max by (node, device, port) (dgxdoctor_ib_port_xmit_bytes_per_second{{{NODE}}})", RAIL + " xmit"),
                Q(f"-max by (node, device, port) (dgxdoctor_ib_port_rcv_bytes_per_second{{{NODE}}})", RAIL + " rcv"),
            ],
            "Bps",
        ),
    ]


def nccl() -> Panels:
    return [
        row("NCCL all-reduce bandwidth"),
        timeseries(
            "All-reduce busbw vs expected",
            "Bus bandwidth of the last NCCL all-reduce probe at its largest message, per node, with the expected "
            "value of `[checks.nccl] expected_busbw_gbps`. Below 0.7 of expected (the runbook's floor) the check is "
            "critical: look at the rails (down, slow, errors), NCCL_IB_HCA/NCCL_SOCKET_IFNAME and whether NCCL fell "
            "back to TCP (`NCCL_DEBUG=INFO`).",
            [
                Q(f"max by (node) (dgxdoctor_nccl_busbw_bytes_per_second{{{NODE}}})", "{{node}} busbw"),
                Q(f"max by (node) (dgxdoctor_nccl_avg_busbw_bytes_per_second{{{NODE}}})", "{{node}} average busbw"),
                Q(f"max by (node) (dgxdoctor_nccl_expected_busbw_bytes_per_second{{{NODE}}})", "{{node}} expected"),
            ],
            "Bps",
            width=16,
        ),
        stat(
            "busbw / expected",
            "The last probe's busbw as a fraction of the expected value: red below 0.7, the runbook's floor. No "
            "value: no expected_busbw_gbps configured, or the probe (off by default) never ran.",
            [
                Q(
                    f"max by (node) (dgxdoctor_nccl_busbw_bytes_per_second{{{NODE}}}) / max by (node) "
                    f"(dgxdoctor_nccl_expected_busbw_bytes_per_second{{{NODE}}})",
                    "{{node}}",
                )
            ],
            "percentunit",
            steps=thresholds((None, "red"), (0.7, "green")),
            width=8,
            height=8,
        ),
    ]


def remediation() -> Panels:
    return [
        row("Remediation"),
        stat(
            "Remediation mode",
            "The remediation mode in force on each node ([remediation] mode): `observe` decides and logs what it "
            "would do, `act` runs the actions. Act mode on a node whose breaker is open still runs nothing.",
            [Q(f"max by (node, mode) (dgxdoctor_remediation_mode{{{NODE}}}) == 1", "{{node}}: {{mode}}")],
            "none",
            steps=thresholds((None, "blue")),
            width=6,
            height=6,
        ),
        stat(
            "Remediation breaker",
            "OPEN: the action budget is spent and nothing more runs until an operator fixes the cause and runs "
            "`dgxdoctor remediation reset` on that node.",
            [Q(f"max by (node) (dgxdoctor_remediation_breaker_open{{{NODE}}})", "{{node}}")],
            "none",
            mappings=[
                dash.ValueMap(
                    options={
                        "0": dash.ValueMappingResult(text="closed", color="green", index=0),
                        "1": dash.ValueMappingResult(text="OPEN", color="red", index=1),
                    }
                )
            ],
            width=6,
            height=6,
        ),
        timeseries(
            "Remediation actions",
            "Actions run per interval, by action and outcome. A failed or interrupted action did not verify: "
            "`dgxdoctor remediation status` and the audit log (state_dir/remediation.jsonl) say why.",
            [
                Q(
                    f"sum by (node, action, outcome) "
                    f"(increase(dgxdoctor_remediation_actions_total{{{NODE}}}[$__rate_interval]))",
                    "{{node}} {{action}} {{outcome}}",
                )
            ],
            "short",
            width=12,
            height=6,
        ),
    ]


def build() -> dash_b.Dashboard:
    board = frame(
        TITLE,
        UID,
        "Both serving nodes side by side: dgxdoctor's checks, GPUs, XIDs, the RDMA rails, NCCL bandwidth, drift "
        "and imbalance between the nodes, and remediation.",
        ["dgxdoctor", "gpu", "infiniband"],
    )
    for section in (health, peers, gpus, xids, infiniband, nccl, remediation):
        for item in section():
            board = board.with_row(item) if isinstance(item, dash_b.Row) else board.with_panel(item)
    return board

"""The first-event table: every shipped alert, the series that make its first event after a cold start, and when
it must fire. ``test_alert_first_event.py`` runs each row under ``promtool test rules``; an alert without a row
fails there.

Every series starts absent, as after an agent start: Prometheus scrapes every 15 s and the first ``ABSENT``
scrapes find nothing. A row is either

* ``Gauges``: the series as the daemon exports them after that, each born at its first value (a finding, a
  reading: a gauge exists from the run that sees it), or
* ``Scenario``: the name of a run of the real code (``test_alert_first_event.SCENARIOS``: a check, the store,
  the scheduler, remediation and the exporters) whose scrapes are the series: a counter comes out of the exposition
  as the daemon serves it, at 0 from the start or born at its first count.

``labels`` are the firing alert's (the series' labels for most); ``fires_at`` a time by which the rule's ``for``
has passed; ``value`` what ``{{ $value }}`` renders, where the annotations print it.
"""

from __future__ import annotations

from typing import NamedTuple

ABSENT = 3  # scrapes (0 s, 15 s, 30 s) that find no series: the agent is not up yet
STEP_S = 15


class Series(NamedTuple):
    metric: str
    values: str  # promtool's expanding notation, from the first scrape after the absent ones
    labels: dict[str, str]


class Gauges(NamedTuple):
    series: tuple[Series, ...]
    labels: dict[str, str]
    fires_at: str
    value: str = ""


class Scenario(NamedTuple):
    name: str
    labels: dict[str, str]
    fires_at: str


def s(metric: str, values: str, **labels: str) -> Series:
    return Series(metric, values, labels)


A = {"node": "dgx-a"}
GPU = {"node": "dgx-a", "pci_bus_id": "00000000:19:00.0"}
PORT = {"node": "dgx-a", "device": "mlx5_0", "port": "1"}
FINDINGS = "dgxdoctor_check_findings_by_code"
NOW = "1764590590+15x80"  # a last-seen timestamp that follows the clock: the event keeps happening


def num(v: float) -> str:
    """A value as promtool's series notation reads it: 1e+09 would read as 1e plus 09."""
    return str(int(v)) if v == int(v) else f"{v:g}"


def finding(check: str, code: str, fires_at: str, status: str = "critical") -> Gauges:
    labels = {**A, "check": check, "code": code, "status": status}
    return Gauges((s(FINDINGS, "1x80", **labels),), labels, fires_at)


def xid(code: int, status: str = "critical") -> Gauges:
    """The xid check's finding and the XID's last-seen time, both born at the XID's first line."""
    return Gauges(
        (
            s("dgxdoctor_xid_last_seen_timestamp_seconds", NOW, **GPU, xid=str(code)),
            s(FINDINGS, "1x80", **A, check="xid", code=f"XID_{code}", status=status),
        ),
        {**GPU, "xid": str(code)},
        "1m",
    )


def ib_errors(counter: str, per_second: float, fires_at: str) -> Gauges:
    labels = {**PORT, "counter": counter}
    return Gauges(
        (s("dgxdoctor_ib_port_errors_per_second", f"{num(per_second)}x80", **labels),),
        labels,
        fires_at,
        num(per_second),
    )


def kernel(code: str) -> Gauges:
    return finding("xid", code, "1m")


# Each agent's serving group, from its start (exporters.collector.NODE_INFO): what the comparison rules join.
GROUP_INFO = (
    s("dgxdoctor_node_info", "1x80", node="dgx-a", group="glm-a"),
    s("dgxdoctor_node_info", "1x80", node="dgx-b", group="glm-a"),
)


def asymmetric(metric: str, floor: float, bad: str, rail: bool = False) -> Gauges:
    """Two nodes of one serving group born at their first readings, dgx-b the odd one: 10x the floor against the
    floor, 90% off the best node ((10 - 1) / 10 either way)."""
    where = {"device": "mlx5_0", "port": "1"} if rail else {}
    good, odd = (10 * floor, floor) if bad == "low" else (floor, 10 * floor)
    return Gauges(
        (
            *GROUP_INFO,
            s(metric, f"{num(good)}x80", node="dgx-a", **where),
            s(metric, f"{num(odd)}x80", node="dgx-b", **where),
        ),
        {"node": "dgx-b", "group": "glm-a", **where},
        "12m",
        "90%",
    )


FIRST_EVENT: dict[str, Gauges | Scenario] = {
    # remediation
    "DgxdoctorVllmDown": finding("vllm", "VLLM_DEAD", "2m"),
    "DgxdoctorRayClusterDegraded": finding("ray", "RAY_GPUS_MISSING", "2m"),
    "DgxdoctorNcclFailure": Scenario("nccl_timeout_in_vllm_log", {**A, "code": "NCCL_TIMEOUT"}, "90s"),
    "DgxdoctorRemediationBreakerOpen": Gauges((s("dgxdoctor_remediation_breaker_open", "0 0 1x80", **A),), A, "2m"),
    "DgxdoctorRemediationFailed": Scenario(
        "restart_vllm_fails", {**A, "action": "restart_vllm", "outcome": "failed"}, "90s"
    ),
    # gpu
    "DgxdoctorXidApplicationError": xid(13, "warning"),
    "DgxdoctorXidContactSupport": xid(16),
    "DgxdoctorXidGpuResetRequired": xid(48),
    "DgxdoctorXidNvlinkError": xid(74),
    "DgxdoctorXidRebootRequired": xid(79),
    "DgxdoctorXidRecoveryAction": xid(154),
    # infiniband
    "DgxdoctorIbPortDown": Gauges((s("dgxdoctor_ib_port_up", "0x80", **PORT),), PORT, "3m"),
    "DgxdoctorIbLinkFlapping": Gauges((s("dgxdoctor_ib_port_link_flaps", "2x80", **PORT),), PORT, "1m", "2"),
    "DgxdoctorIbErrorsExcessiveBufferOverrunErrors": ib_errors("excessive_buffer_overrun_errors", 1, "1m"),
    "DgxdoctorIbErrorsLinkDowned": ib_errors("link_downed", 1, "1m"),
    "DgxdoctorIbErrorsLinkErrorRecovery": ib_errors("link_error_recovery", 1, "6m"),
    "DgxdoctorIbErrorsLocalAckTimeoutErr": ib_errors("local_ack_timeout_err", 2, "6m"),
    "DgxdoctorIbErrorsLocalLinkIntegrityErrors": ib_errors("local_link_integrity_errors", 1, "1m"),
    "DgxdoctorIbErrorsPortRcvErrors": ib_errors("port_rcv_errors", 20, "6m"),
    "DgxdoctorIbErrorsPortXmitDiscards": ib_errors("port_xmit_discards", 200, "6m"),
    "DgxdoctorIbErrorsRnrNakRetryErr": ib_errors("rnr_nak_retry_err", 1, "1m"),
    "DgxdoctorIbErrorsRoceSlowRestart": ib_errors("roce_slow_restart", 20, "6m"),
    "DgxdoctorIbErrorsSymbolError": ib_errors("symbol_error", 20, "6m"),
    "DgxdoctorIbErrorsSymbolErrorBer": ib_errors("symbol_error", 1, "6m"),
    # kernel
    "DgxdoctorKernelAerFatal": kernel("KERNEL_AER_FATAL"),
    "DgxdoctorKernelAerNonfatal": kernel("KERNEL_AER_NONFATAL"),
    "DgxdoctorKernelAerUnrecovered": kernel("KERNEL_AER_UNRECOVERED"),
    "DgxdoctorKernelMceUncorrected": kernel("KERNEL_MCE_UNCORRECTED"),
    "DgxdoctorKernelMemoryFailure": kernel("KERNEL_MEMORY_FAILURE"),
    "DgxdoctorKernelMlx5ProbeFailed": kernel("KERNEL_MLX5_PROBE_FAILED"),
    "DgxdoctorKernelEdacUe": kernel("KERNEL_EDAC_UE"),
    "DgxdoctorKernelLinkDown": kernel("KERNEL_LINK_DOWN"),
    "DgxdoctorKernelMlx5CmdTimeout": kernel("KERNEL_MLX5_CMD_TIMEOUT"),
    "DgxdoctorKernelMlx5Fatal": kernel("KERNEL_MLX5_FATAL"),
    "DgxdoctorKernelMlx5Health": kernel("KERNEL_MLX5_HEALTH"),
    "DgxdoctorKernelModuleEvent": kernel("KERNEL_MODULE_EVENT"),
    "DgxdoctorKernelNfsNotResponding": kernel("KERNEL_NFS_NOT_RESPONDING"),
    "DgxdoctorKernelNvrmApiMismatch": kernel("KERNEL_NVRM_API_MISMATCH"),
    "DgxdoctorKernelNvrmInitFailed": kernel("KERNEL_NVRM_INIT_FAILED"),
    "DgxdoctorKernelNvswitchFatal": kernel("KERNEL_NVSWITCH_FATAL"),
    "DgxdoctorKernelOomKill": kernel("KERNEL_OOM_KILL"),
    "DgxdoctorFabricManagerDown": finding("driver_stack", "DRIVER_FABRIC_MANAGER_DOWN", "2m"),
    # vllm
    "DgxdoctorVllmKvCacheHigh": Gauges(
        (s("dgxdoctor_vllm_kv_cache_usage_ratio", "0.95x80", **A, model="glm"),), {**A, "model": "glm"}, "7m"
    ),
    "DgxdoctorVllmQueueWaiting": Gauges(
        (s("dgxdoctor_vllm_requests_waiting", "3x80", **A, model="glm"),), {**A, "model": "glm"}, "17m"
    ),
    "DgxdoctorVllmEngineNoProgress": Gauges(
        (s("dgxdoctor_vllm_seconds_since_progress", "0 0 15x80", **A),), A, "90s", "15"
    ),
    "DgxdoctorTpRankStopped": Gauges(
        (
            s("dgxdoctor_vllm_seconds_since_progress", "0 0 15x80", **A),
            s("dgxdoctor_gpu_utilization_ratio", "1x80", **A, gpu="0"),
            s("dgxdoctor_gpu_utilization_ratio", "0x80", node="dgx-b", gpu="0"),
        ),
        {"node": "dgx-b"},
        "90s",
    ),
    "DgxdoctorNcclRankUnresponsive": Gauges(
        (
            s(
                "dgxdoctor_ras_rank_problem_since_timestamp_seconds",
                "1764590590x80",
                **A,
                kind="unresponsive",
                rank="11",
                host="10.0.0.2",
                pid="48213",
                gpu="3",
                nvml_gpu="3",
            ),
        ),
        {**A, "kind": "unresponsive", "rank": "11", "host": "10.0.0.2", "pid": "48213", "gpu": "3", "nvml_gpu": "3"},
        "1m",
    ),
    "DgxdoctorGpuWaitingOnPeer": Gauges(
        (
            s("dgxdoctor_gpu_utilization_ratio", "1x80", **A, gpu="0"),
            s("dgxdoctor_gpu_memory_utilization_ratio", "0x80", **A, gpu="0"),
        ),
        {**A, "gpu": "0"},
        "2m",
    ),
    # A jump needs its baseline: TTFT born at 0.2 s, at 2 s from 25 minutes on.
    "DgxdoctorVllmTtftP99Jump": Gauges(
        (s("dgxdoctor_vllm_ttft_p99_seconds", "0.2x100 2x60", **A, model="glm"),), {**A, "model": "glm"}, "33m"
    ),
    # fleet
    "DgxdoctorCheckCritical": Gauges(
        (s("dgxdoctor_check_status", "2x80", **A, check="gpu"),), {**A, "check": "gpu"}, "12m"
    ),
    "DgxdoctorPeerDown": Gauges(
        (s("dgxdoctor_peer_up", "0x80", **A, peer="http://dgx-b:9835"),), {**A, "peer": "http://dgx-b:9835"}, "3m"
    ),
    "DgxdoctorAgentDown": Gauges(
        (s("up", "0x80", job="dgxdoctor", instance="dgx-a:9835"),),
        {"job": "dgxdoctor", "instance": "dgx-a:9835"},
        "3m",
    ),
    "DgxdoctorVersionDrift": Gauges(
        (
            s("dgxdoctor_node_fact_info", "1x80", node="dgx-a", key="driver_version", value="580.159.04"),
            s("dgxdoctor_node_fact_info", "1x80", node="dgx-b", key="driver_version", value="570.86.15"),
        ),
        {"key": "driver_version"},
        "7m",
    ),
    "DgxdoctorProbeTimeouts": Scenario("nvidia_smi_hangs", {**A, "check": "topology", "probe": "nvidia-smi"}, "90s"),
    "DgxdoctorNodeAsymmetricGpuMemoryUsed": asymmetric("dgxdoctor_gpu_memory_used_bytes", 1073741824, "low"),
    "DgxdoctorNodeAsymmetricGpuUtilization": asymmetric("dgxdoctor_gpu_utilization_ratio", 0.2, "low"),
    "DgxdoctorNodeAsymmetricGpuTemperature": asymmetric("dgxdoctor_gpu_temperature_celsius", 60, "high"),
    "DgxdoctorNodeAsymmetricGpuPower": asymmetric("dgxdoctor_gpu_power_watts", 800, "low"),
    "DgxdoctorNodeAsymmetricIbErrors": asymmetric("dgxdoctor_ib_port_errors_per_second", 1, "high", rail=True),
    "DgxdoctorNodeAsymmetricIbRcvThroughput": asymmetric(
        "dgxdoctor_ib_port_rcv_bytes_per_second", 1e8, "low", rail=True
    ),
    "DgxdoctorNodeAsymmetricIbXmitThroughput": asymmetric(
        "dgxdoctor_ib_port_xmit_bytes_per_second", 1e8, "low", rail=True
    ),
    "DgxdoctorNodeAsymmetricNcclBusbw": asymmetric("dgxdoctor_nccl_busbw_bytes_per_second", 1e9, "low"),
    "DgxdoctorNodeAsymmetricNcclRailBusbw": asymmetric(
        "dgxdoctor_nccl_rail_busbw_bytes_per_second", 1e9, "low", rail=True
    ),
    "DgxdoctorNodeAsymmetricVllmKvCacheUsage": asymmetric("dgxdoctor_vllm_kv_cache_usage_ratio", 0.1, "high"),
    # Two serving groups of one node each: glm-b's GPUs at a tenth of glm-a's.
    "DgxdoctorGroupAsymmetric": Gauges(
        (
            s("dgxdoctor_node_info", "1x80", node="dgx-a", group="glm-a"),
            s("dgxdoctor_node_info", "1x80", node="dgx-c", group="glm-b"),
            s("dgxdoctor_gpu_utilization_ratio", "0.9x80", node="dgx-a", gpu="0"),
            s("dgxdoctor_gpu_utilization_ratio", "0.09x80", node="dgx-c", gpu="0"),
        ),
        {"group": "glm-b", "metric": "gpu_utilization"},
        "12m",
        "90%",
    ),
}

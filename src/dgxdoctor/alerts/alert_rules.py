"""Prometheus alert rules over dgxdoctor's metrics, generated from the tables the checks and remediation use.

The XID classes come from ``judge.xid.RESOLUTION_CLASSES`` over NVIDIA's catalog (``data/xid_catalog.json``),
the IB error limits from the infiniband check's defaults, the asymmetry limits from the peer comparison's
tolerances (through the median recording rules of ``peer_rules``, so 2 nodes and 200 alike), the codes that ask
for a restart from ``judge.consequence`` (the table that decides each finding's action).
Alerts remediation may act on carry ``dgxdoctor_action`` (``restart_vllm``, ``restart_cluster``) and ``node``.
Regenerate the shipped file with
``python -m dgxdoctor.alerts.alert_rules > src/dgxdoctor/alerts/dgxdoctor-alerts.rules.yml``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable

from msgspec import Struct, field
from msgspec.structs import replace

from dgxdoctor.alerts.peer_rules import GROUP_INFO, NODE_INFO, odd_member_expr
from dgxdoctor.checks import xid as checks_xid
from dgxdoctor.fleet.compare import GROUP_CAUSE, GROUP_IMBALANCE_CODE, RULES
from dgxdoctor.judge.consequence import TABLE as CONSEQUENCES
from dgxdoctor.judge.infiniband import DEFAULT_THRESHOLDS
from dgxdoctor.judge.kernel import RULES as KERNEL_RULES
from dgxdoctor.judge.vllm import DEFAULT_STALL_S
from dgxdoctor.judge.xid import XidClass, xid_class
from dgxdoctor.result import Status
from dgxdoctor.sources.xid import load_catalog

FINDINGS_BY_CODE = "dgxdoctor_check_findings_by_code"
# How long a restart condition must last before the alert fires. Short on purpose: the remediation guard applies
# its own hold_s, start-up grace and cooldown, and an alert that waits long only delays the cure.
RESTART_FOR = "30s"
XID_LAST_SEEN = checks_xid.XID_LAST_SEEN.name
_PER_SECONDS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}


class Alert(Struct, frozen=True):
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"      - alert: {self.name}", f"        expr: {json.dumps(self.expr)}"]
        if self.for_ != "0s":
            out.append(f"        for: {self.for_}")
        out.append("        labels:")
        for key, value in {"severity": self.severity, **self.labels}.items():
            out.append(f"          {key}: {json.dumps(value)}")
        out.append("        annotations:")
        out.append(f"          summary: {json.dumps(self.summary)}")
        out.append(f"          description: {json.dumps(self.description)}")
        return out


def _codes(codes: Iterable[str]) -> str:
    return "|".join(sorted(codes))


def restart_codes(check: str, action: str) -> list[str]:
    """The codes of ``check``'s findings whose action is ``action`` (judge.consequence), sorted."""
    return sorted(code for code, c in CONSEQUENCES.items() if c.check == check and c.action == action)


# (check, action) -> the alert that carries it. The head's own peer comparison (PEER_MP_WORKER_DOWN) has none: its
# remediation reads the finding from its own results, and an alert would come from the same node.
REMEDIATION_ALERTS = {
    ("vllm", "restart_vllm"): "DgxdoctorVllmDown",
    ("ray", "restart_cluster"): "DgxdoctorRayClusterDegraded",
    ("logs", "restart_cluster"): "DgxdoctorNcclFailure",
}


def remediation_alerts() -> list[Alert]:
    vllm_codes = _codes(restart_codes("vllm", "restart_vllm"))
    vllm = f'{FINDINGS_BY_CODE}{{check="vllm",status="critical",code=~"{vllm_codes}"}} > 0'
    ray_codes = _codes(restart_codes("ray", "restart_cluster"))
    ray = f'{FINDINGS_BY_CODE}{{check="ray",status="critical",code=~"{ray_codes}"}} > 0'
    # The logs check's signatures, on their match counter: a line seen is the event, whatever the finding's age.
    # The counter exists at 0 for every signature code from the agent's start (LogsCheck.zero_samples): the first
    # failure is an increase.
    logs_codes = _codes(restart_codes("logs", "restart_cluster"))
    nccl = f'increase(dgxdoctor_logs_signature_matches_total{{code=~"{logs_codes}"}}[5m]) > 0'
    return [
        Alert(REMEDIATION_ALERTS[("vllm", "restart_vllm")], vllm, RESTART_FOR, "critical",
              "vLLM on {{ $labels.node }}: {{ $labels.code }}",
              "vLLM is dead, hung or makes no progress (finding {{ $labels.code }}); remediation restarts it "
              "when [remediation] mode = \"act\".", {"dgxdoctor_action": "restart_vllm"}),
        Alert(REMEDIATION_ALERTS[("ray", "restart_cluster")], ray, RESTART_FOR, "critical",
              "Ray cluster degraded seen from {{ $labels.node }}: {{ $labels.code }}",
              "a Ray node is dead or GPUs are missing (the runbook's 'GPU 8 of 16'); the head's agent restarts "
              "the cluster in the runbook's order when in act mode.", {"dgxdoctor_action": "restart_cluster"}),
        Alert(REMEDIATION_ALERTS[("logs", "restart_cluster")], nccl, "0s", "critical",
              "NCCL/Gloo failure in the logs on {{ $labels.node }}: {{ $labels.code }}",
              "a collective between the nodes failed (or a Ray process lost the GCS); a cluster restart "
              "re-establishes the communicators. If it recurs, check the IB links and the NCCL environment.",
              {"dgxdoctor_action": "restart_cluster"}),
        Alert("DgxdoctorRemediationBreakerOpen", "dgxdoctor_remediation_breaker_open == 1", "0s", "critical",
              "remediation breaker open on {{ $labels.node }}",
              "the action budget is spent: nothing more runs until an operator fixes the cause and runs "
              "`dgxdoctor remediation reset`."),
        Alert("DgxdoctorRemediationFailed",
              'increase(dgxdoctor_remediation_actions_total{outcome=~"failed|interrupted"}[1h]) > 0', "0s",
              "warning", "remediation {{ $labels.action }} {{ $labels.outcome }} on {{ $labels.node }}",
              "an action did not verify; see `dgxdoctor remediation status` and <state_dir>/remediation.jsonl."),
    ]  # fmt: skip


def xid_alerts() -> list[Alert]:
    """One alert per XID class of ``judge.xid.RESOLUTION_CLASSES`` over the shipped catalog, at the class's severity.

    It fires while the xid check reports that XID at that severity (joined on node and XID): the check's own
    answer, with its overrides, repeats and line refinements. A reset, reboot or case is a person's work: the
    alert stays until the check clears the XID (the node's reboot, or ``clear_after_s``), not some minutes after.
    """
    by_alert: dict[str, list[tuple[int, XidClass]]] = defaultdict(list)
    for entry in load_catalog().xids.values():
        cls = xid_class(entry.code, entry.resolution)
        if not entry.unused and cls.alert:
            by_alert[cls.alert].append((entry.code, cls))
    alerts = []
    for name, members in sorted(by_alert.items()):
        main = Counter(cls for _, cls in members).most_common(1)[0][0]
        regex = "|".join(str(code) for code, _ in sorted(members, key=lambda m: m[0]))
        levels = "warning|critical" if main.status is Status.WARNING else main.status.value
        verdict = f'{FINDINGS_BY_CODE}{{check="xid",status=~"{levels}",code=~"XID_({regex})"}}'
        expr = f'{XID_LAST_SEEN} and on (node, xid) label_replace({verdict}, "xid", "$1", "code", "XID_(.+)")'
        remedy = main.remedy.format(bus="{{ $labels.pci_bus_id }}", xid="{{ $labels.xid }}")
        classes = ", ".join(sorted({cls.key for _, cls in members}))
        alerts.append(
            Alert(name, expr, "0s", main.status.value,
                  "XID {{ $labels.xid }} on GPU {{ $labels.pci_bus_id }} of {{ $labels.node }}",
                  f"{remedy}. XID class {classes}: fires while the xid check reports it ({levels}), until the "
                  "node reboots or clear_after_s passes (a GPU reset is not seen: silence it once one is done).")
        )  # fmt: skip
    return alerts


def ib_alerts() -> list[Alert]:
    alerts = [
        Alert("DgxdoctorIbPortDown", "dgxdoctor_ib_port_up == 0", "2m", "critical",
              "IB port {{ $labels.device }}/{{ $labels.port }} down on {{ $labels.node }}",
              "the RDMA port is not Active/LinkUp: `ibstat {{ $labels.device }}`; check the cable and the switch "
              "port. A restart cannot fix a link."),
        Alert("DgxdoctorIbLinkFlapping", "dgxdoctor_ib_port_link_flaps >= 2", "0s", "warning",
              "IB port {{ $labels.device }}/{{ $labels.port }} flapping on {{ $labels.node }}",
              "the link went down and retrained {{ $value }} times in the flap window: reseat or replace the "
              "cable or transceiver."),
    ]  # fmt: skip
    for rule_name, t in sorted(DEFAULT_THRESHOLDS.items()):
        counter = t.counter or rule_name
        limit = 0.0 if t.kind == "increase" else t.limit / _PER_SECONDS[t.per]
        alerts.append(
            Alert(f"DgxdoctorIbErrors{camel(rule_name)}",
                  f'dgxdoctor_ib_port_errors_per_second{{counter="{counter}"}} > {limit:g}',
                  "0s" if t.kind == "increase" else "5m", t.severity,
                  f"IB {counter} on {{{{ $labels.device }}}}/{{{{ $labels.port }}}} of {{{{ $labels.node }}}}",
                  f"{counter} at {{{{ $value }}}}/s, above the NIC health limit "
                  f"({'any increase' if t.kind == 'increase' else f'{t.limit:g} per {t.per}'})."),
        )  # fmt: skip
    return alerts


def kernel_alerts() -> list[Alert]:
    """One alert per kernel fault kind that can be critical (judge/kernel.py's table), and the fabric manager: on the
    findings gauge, so a recovery (link up, NFS OK) or the end of the boot resolves them."""
    alerts = []
    for kind, rule in sorted(KERNEL_RULES.items()):
        if rule.status is not Status.CRITICAL and kind != "oom_kill":  # OOM: critical when it killed vLLM or Ray
            continue
        name = "DgxdoctorKernel" + "".join(part.capitalize() for part in kind.split("_"))
        expr = f'{FINDINGS_BY_CODE}{{check="xid",code="{rule.code}",status="critical"}} > 0'
        alerts.append(
            Alert(name, expr, "0s", "critical", f"{rule.title} on {{{{ $labels.node }}}}",
                  f"the kernel log shows {rule.title} (finding {rule.code}; `dgxdoctor check --json` names the "
                  f"device and the line): {rule.remedy}. A restart of vLLM or Ray cannot fix it.")
        )  # fmt: skip
    fm = f'{FINDINGS_BY_CODE}{{check="driver_stack",code="DRIVER_FABRIC_MANAGER_DOWN",status="critical"}} > 0'
    alerts.append(
        Alert("DgxdoctorFabricManagerDown", fm, "1m", "critical", "nvidia-fabricmanager down on {{ $labels.node }}",
              "an NVSwitch node without its fabric manager: CUDA fails with 'system not yet initialized'. "
              "`systemctl status nvidia-fabricmanager`; its version must equal the driver's.")
    )  # fmt: skip
    return alerts


def vllm_alerts() -> list[Alert]:
    ttft = "dgxdoctor_vllm_ttft_p99_seconds"
    return [
        Alert("DgxdoctorVllmKvCacheHigh", "avg_over_time(dgxdoctor_vllm_kv_cache_usage_ratio[10m]) > 0.9", "5m",
              "warning", "KV cache above 90% on {{ $labels.node }}",
              "the runbook: KV cache usage above 0.9 sustained means scale out or lower concurrency "
              "(--max-num-seqs, --max-model-len)."),
        Alert("DgxdoctorVllmQueueWaiting", "dgxdoctor_vllm_requests_waiting > 0", "15m", "warning",
              "requests waiting for 15 minutes on {{ $labels.node }}",
              "the runbook: a waiting queue that stays non-zero means the concurrency limit is set too low."),
        Alert("DgxdoctorVllmEngineNoProgress", f"dgxdoctor_vllm_seconds_since_progress >= {DEFAULT_STALL_S / 2:g}",
              "0s", "warning", "vLLM's engine on {{ $labels.node }} made no step for {{ $value }} s",
              f"requests are running or waiting and no engine step or token was counted; at {DEFAULT_STALL_S:g} s "
              "the vllm check says ENGINE_HUNG (and DgxdoctorVllmDown follows). Look at both nodes: a stuck "
              "collective stops every rank."),
        Alert("DgxdoctorTpRankStopped",
              f"max by (node) (dgxdoctor_gpu_utilization_ratio) < 0.1 and on () "
              f"(max(dgxdoctor_vllm_seconds_since_progress) >= {DEFAULT_STALL_S / 2:g})", "0s", "critical",
              "{{ $labels.node }}'s GPUs went idle while vLLM's engine is stalled",
              "a tensor-parallel rank waiting in a collective keeps its GPU at 100% (the NCCL kernel spins for its "
              "peer, docs/h200/hang-recording-2026-11-30): the node whose GPUs are idle during the stall is the one "
              "whose rank stopped (a dead or stopped Ray worker, a GPU that fell off). Look there first: its vLLM "
              "worker processes, XIDs, `ray status`."),
        Alert("DgxdoctorNcclRankUnresponsive",
              'dgxdoctor_ras_rank_problem_since_timestamp_seconds{kind=~"unresponsive|dead"}', "0s", "critical",
              "NCCL's RAS on {{ $labels.node }}: rank {{ $labels.rank }} ({{ $labels.host }}, pid {{ $labels.pid }}, "
              "GPU {{ $labels.gpu }}) is {{ $labels.kind }}",
              "NCCL's RAS (the keep-alive mesh inside every NCCL process) gets no answer from that rank's process, or "
              "considers it dead: every other rank waits for it in the collective. The peer comparison's "
              "PEER_TP_RANK_STUCK names its node, GPU and rail (checks/ras.py, docs/checks/ras.md)."),
        Alert("DgxdoctorGpuWaitingOnPeer",
              "dgxdoctor_gpu_utilization_ratio >= 0.95 and dgxdoctor_gpu_memory_utilization_ratio < 0.02", "30s",
              "warning", "GPU {{ $labels.gpu }} on {{ $labels.node }} spins with no memory traffic",
              "a kernel is resident (utilization 100%) but reads and writes nothing: the sign of an NCCL collective "
              "waiting for a peer that stopped (docs/h200/hang-recording-2026-11-30). Look at the other node's "
              "GPUs and vLLM workers; DgxdoctorTpRankStopped names the idle one."),
        Alert("DgxdoctorVllmTtftP99Jump",
              f"{ttft} > 3 * avg_over_time({ttft}[1h] offset 15m) and {ttft} > 0.5", "5m", "warning",
              "TTFT P99 jumped on {{ $labels.node }}",
              "the runbook: a TTFT P99 jump usually means long inputs crowd the prefill; check the prompt lengths "
              "and --max-num-batched-tokens."),
    ]  # fmt: skip


def asymmetry_alerts() -> list[Alert]:
    """Per compared metric, the node its serving group's comparison names (the mesh's verdict, ``peer_rules``), and
    one alert for a serving group the comparison between the groups names."""
    alerts = []
    for rule in RULES:
        alerts.append(
            Alert(f"DgxdoctorNodeAsymmetric{camel(rule.key)}", odd_member_expr(rule, rule.tolerance, False), "10m",
                  "warning", f"{{{{ $labels.node }}}} is the odd node of serving group {{{{ $labels.group }}}} on "
                  f"{rule.what}",
                  f"{rule.code}: {{{{ $labels.node }}}} is {{{{ $value | humanizePercentage }}}} off the best node of "
                  f"its group (tolerance {rule.tolerance:.0%}). Likely cause: {rule.cause}")
        )  # fmt: skip
    across = " or ".join(
        f'label_replace({odd_member_expr(rule, rule.tolerance, True)}, "metric", "{rule.key}", "", "")'
        for rule in RULES
    )
    alerts.append(
        Alert("DgxdoctorGroupAsymmetric", across, "10m", "warning",
              "serving group {{ $labels.group }} is the odd group on {{ $labels.metric }}",
              f"{GROUP_IMBALANCE_CODE}: the mean of {{{{ $labels.metric }}}} over the group's nodes is "
              f"{{{{ $value | humanizePercentage }}}} off the best group's (the peer comparison's tolerance for that "
              f"metric). Likely cause: {GROUP_CAUSE}")
    )  # fmt: skip
    return alerts


def fleet_alerts() -> list[Alert]:
    # A down agent exports nothing: its node and serving group come from what it last exported on that instance, so
    # the page names them and Alertmanager groups it with its group.
    down = 'up{job="dgxdoctor"} == 0'
    last_info = f"topk by (instance) (1, last_over_time({NODE_INFO}[1d]))"
    agent_down = f"({down}) * on(instance) group_left(node, group) {last_info} or on(instance) ({down})"
    versions = 'dgxdoctor_node_fact_info{key=~".*_version|kernel_release|model_fingerprint"}'
    return [
        Alert("DgxdoctorCheckCritical", "dgxdoctor_check_status == 2", "10m", "critical",
              "check {{ $labels.check }} critical on {{ $labels.node }}",
              "`dgxdoctor check --only {{ $labels.check }}` on the node shows the findings and the remedy."),
        Alert("DgxdoctorPeerDown", "dgxdoctor_peer_up == 0", "2m", "warning",
              "{{ $labels.node }} cannot reach its peer {{ $labels.peer }}",
              "the peer's dgxdoctor does not answer /state: the node is down, dgxdoctor stopped, or the network "
              "or the token between them is wrong."),
        Alert("DgxdoctorAgentDown", agent_down, "2m", "critical",
              "dgxdoctor on {{ $labels.instance }} is not scraped",
              "the node or its agent is down (this rule assumes the scrape job is named \"dgxdoctor\"); node and "
              "group are those the agent last exported on that instance, within a day."),
        # By serving group ([node] group, dgxdoctor_node_info): two groups on different versions are no drift; nodes
        # whose agent exports no group (an older release) are one group.
        Alert("DgxdoctorVersionDrift",
              f"count by (group, key) (count by (group, key, value) ({with_group(versions)})) > 1",
              "5m", "critical", "nodes disagree on {{ $labels.key }}",
              "the runbook: both machines must run the same driver, CUDA, vLLM, Ray and model files; see "
              "dgxdoctor_node_fact_info{key=\"{{ $labels.key }}\"} for which node differs."),
        Alert("DgxdoctorProbeTimeouts",
              "increase(dgxdoctor_check_timeouts_total[15m]) > 0 or increase(dgxdoctor_probe_timeouts_total[15m]) > 0",
              "0s", "warning", "probes time out on {{ $labels.node }}",
              "a check or probe did not answer within its timeout: NVML hanging on a GPU that fell off the bus, "
              "a stuck mount, or an overloaded node."),
    ]  # fmt: skip


def camel(key: str) -> str:
    """``symbol_error`` -> ``SymbolError``: every alert name is CamelCase, as Prometheus' own are."""
    return "".join(part[:1].upper() + part[1:] for part in key.split("_"))


def with_group(expr: str) -> str:
    """``expr`` with each series' serving group (``group``, from ``dgxdoctor_node_info`` joined on ``node``), so that
    Alertmanager groups by it: one stuck group, one page. Series of a node that exports no group (an agent of a
    release before groups) and series with no ``node`` pass unchanged: a missing label never hides an alert."""
    return f"({expr}) * on(node) group_left(group) {GROUP_INFO} or on(node) ({expr})"


def all_alerts() -> list[tuple[str, list[Alert]]]:
    """Every alert, its expression carrying the node's serving group (``with_group``)."""
    return [(name, [replace(a, expr=with_group(a.expr)) for a in alerts]) for name, alerts in _alerts()]


def _alerts() -> list[tuple[str, list[Alert]]]:
    return [
        ("dgxdoctor-remediation", remediation_alerts()),
        ("dgxdoctor-gpu", xid_alerts()),
        ("dgxdoctor-infiniband", ib_alerts()),
        ("dgxdoctor-kernel", kernel_alerts()),
        ("dgxdoctor-vllm", vllm_alerts()),
        ("dgxdoctor-fleet", fleet_alerts() + asymmetry_alerts()),
    ]


def render() -> str:
    lines = [
        "# Generated by `python -m dgxdoctor.alerts.alert_rules`; do not edit by hand.",
        "# dgxdoctor's alerts (docs/remediation.md). Alerts with dgxdoctor_action may be acted on by remediation.",
        "groups:",
    ]
    for group, alerts in all_alerts():
        lines += [f"  - name: {group}", "    rules:"]
        for alert in alerts:
            lines += alert.lines()
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())

"""Prometheus as the cluster view (``[fleet] prometheus_url``): every node's latest status from one query.

The agents export what the view needs: ``dgxdoctor_node_info{node,group}`` (the node's serving group; its
``instance`` target label is where its agent answers), ``dgxdoctor_check_status{node,check}`` and
``dgxdoctor_finding_info{node,check,code,subject,status}``. One instant query (``QUERY``) returns them for every
node Prometheus scrapes, the nodes it scraped within the last hour and no longer does (``dgxdoctor_node_gone``), and
the firing alerts of the comparison (``DgxdoctorNodeAsymmetric*``, ``DgxdoctorGroupAsymmetric``). A message is
never a label: it is read from the ``/state`` of the nodes that are not OK only, under the command's one deadline
(``fleet.cluster.ask_peers``); a node whose ``/state`` does not come keeps the codes and subjects Prometheus has.

By hand: ``curl -G PROMETHEUS/api/v1/query --data-urlencode 'query=dgxdoctor_finding_info'``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import httpx
from msgspec import Struct

from dgxdoctor.fleet.compare import GROUP_IMBALANCE_CODE, RULES, Comparison
from dgxdoctor.fleet.peers import BadAnswer, read_answer, response_json, within
from dgxdoctor.result import UNKNOWN_GROUP, Finding, Status

NODE_INFO = "dgxdoctor_node_info"
CHECK_STATUS = "dgxdoctor_check_status"
FINDING_INFO = "dgxdoctor_finding_info"
GONE = "dgxdoctor_node_gone"
# A node scraped within this long and not now is named (UNKNOWN), not left out: an agent that stopped answering is
# the node an operator asks about.
GONE_WINDOW = "1h"
# The comparison's alerts (alerts.alert_rules.asymmetry_alerts): the rules compare the nodes, the view lists them.
NODE_ASYMMETRIC = "DgxdoctorNodeAsymmetric"
GROUP_ASYMMETRIC = "DgxdoctorGroupAsymmetric"
# An answer of 64 nodes with their findings is some hundred kB; past this, the answer is refused.
MAX_ANSWER_BYTES = 16 * 2**20
# dgxdoctor_check_status's values (result.Status.code) back to statuses.
_BY_CODE = {s.code: s for s in Status}


class PrometheusUnavailable(Exception):
    """Prometheus did not answer the query usably (down, an error, not its API's JSON)."""


class ViewNode(Struct, frozen=True):
    """One node as Prometheus sees it: its document (``ResultsDocument.state()``'s shape, messages empty), or gone."""

    node: str
    group: str
    instance: str
    doc: dict[str, Any] | None  # None: not scraped now (gone)


class PromView(Struct, frozen=True):
    nodes: tuple[ViewNode, ...]
    comparison: Comparison
    seconds: float


def query(job: str) -> str:
    """The one PromQL expression of the view (``job``: the scrape job of the agents)."""
    sel = f'job="{job}"'
    names = "|".join((NODE_INFO, CHECK_STATUS, FINDING_INFO))
    gone = f"last_over_time({NODE_INFO}{{{sel}}}[{GONE_WINDOW}]) unless on(node) {NODE_INFO}{{{sel}}}"
    alerts = f'ALERTS{{alertstate="firing",alertname=~"{NODE_ASYMMETRIC}.+|{GROUP_ASYMMETRIC}"}}'
    return f'{{__name__=~"{names}",{sel}}} or label_replace({gone}, "__name__", "{GONE}", "", "") or {alerts}'


async def instant_query(client: httpx.AsyncClient, url: str, expr: str, timeout_s: float) -> list[Any]:
    """The series of one instant query (``data.result``) to ``url``'s query API, held to ``timeout_s`` connect to
    last byte and to MAX_ANSWER_BYTES; PrometheusUnavailable, saying why, when it gives no usable answer."""
    target = f"{url}/api/v1/query?{urlencode({'query': expr})}"
    try:
        body = await within(read_answer(client, "GET", target, None, max_bytes=MAX_ANSWER_BYTES), timeout_s)
        answer = response_json(body)
    except TimeoutError:
        raise PrometheusUnavailable(f"{url}: no answer within {timeout_s:g} s") from None
    except (httpx.HTTPError, BadAnswer) as exc:
        raise PrometheusUnavailable(f"{url}: {type(exc).__name__}: {exc}"[:400]) from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise PrometheusUnavailable(f"{url}: the query failed: {str(answer)[:300]}")
    data = answer.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise PrometheusUnavailable(f"{url}: not an instant vector")
    return result


async def fetch_view(client: httpx.AsyncClient, url: str, job: str, timeout_s: float) -> PromView:
    """Every node's latest status, findings' codes and subjects and the comparison's alerts: one request to
    ``url``'s query API, held to ``timeout_s`` connect to last byte. PrometheusUnavailable when it gives none."""
    t0 = time.monotonic()
    result = await instant_query(client, url, query(job), timeout_s)
    return parse_view(result, round(time.monotonic() - t0, 6))


def parse_view(result: Sequence[Any], seconds: float = 0.0) -> PromView:
    """The view from the query's series (Prometheus's ``data.result``); series of other shapes are ignored."""
    info: dict[str, tuple[str, str]] = {}
    gone: dict[str, tuple[str, str]] = {}
    checks: dict[str, dict[str, Status]] = defaultdict(dict)
    findings: dict[str, list[dict[str, Any]]] = defaultdict(list)
    alerts: list[Mapping[str, str]] = []
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(labels, dict):
            continue
        name, node = labels.get("__name__"), str(labels.get("node", ""))
        if name == "ALERTS":
            alerts.append(labels)
        elif not node:
            continue
        elif name == NODE_INFO:
            info[node] = (str(labels.get("group") or UNKNOWN_GROUP), str(labels.get("instance", "")))
        elif name == GONE:
            gone[node] = (str(labels.get("group") or UNKNOWN_GROUP), str(labels.get("instance", "")))
        elif name == CHECK_STATUS:
            checks[node][str(labels.get("check", ""))] = _status(item.get("value"))
        elif name == FINDING_INFO:
            findings[node].append(labels)
    nodes = [_node(n, group, instance, checks[n], findings[n]) for n, (group, instance) in sorted(info.items())]
    nodes += [ViewNode(n, group, instance, None) for n, (group, instance) in sorted(gone.items()) if n not in info]
    return PromView(tuple(nodes), _comparison(alerts, [n.node for n in nodes]), seconds)


def _status(value: Any) -> Status:
    try:
        return _BY_CODE.get(int(float(value[1])), Status.UNKNOWN)
    except (TypeError, ValueError, IndexError):
        return Status.UNKNOWN


def _node(
    node: str, group: str, instance: str, checks: Mapping[str, Status], findings: Sequence[Mapping[str, str]]
) -> ViewNode:
    """A results document of what Prometheus has: each check's status, its findings' codes and subjects."""
    by_check: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in findings:
        by_check[f.get("check", "")].append(
            {"code": f.get("code", ""), "status": f.get("status", "unknown"), "subject": f.get("subject") or None,
             "message": "", "group": group}
        )  # fmt: skip
    docs = [
        {"name": name, "status": status.value, "summary": "", "findings": by_check.get(name, [])}
        for name, status in sorted(checks.items())
    ]
    status = Status.worst(checks.values(), default=Status.UNKNOWN if not checks else Status.OK)
    doc: dict[str, Any] = {"node": node, "group": group, "status": status.value, "checks": docs, "facts": {}}
    return ViewNode(node, group, instance, doc)


# alert_rules.camel's names (alerts/ is above this layer): "gpu_utilization" -> "GpuUtilization".
_RULE_OF_ALERT = {NODE_ASYMMETRIC + "".join(p[:1].upper() + p[1:] for p in r.key.split("_")): r for r in RULES}


def _comparison(alerts: Sequence[Mapping[str, str]], nodes: list[str]) -> Comparison:
    """The comparison's firing alerts as its findings (the rules compared; their messages are the rules')."""
    found = []
    for a in alerts:
        rail = f"{a['device']}/{a.get('port', '?')}" if a.get("device") else ""
        where = f" on rail {rail}" if rail else ""
        if a.get("alertname") == GROUP_ASYMMETRIC:
            message = f"serving group {a.get('group')} is the odd group on {a.get('metric')}{where} (Prometheus rules)"
            found.append(Finding(GROUP_IMBALANCE_CODE, Status.WARNING, message, subject=a.get("group")))
            continue
        rule = _RULE_OF_ALERT.get(a.get("alertname", ""))
        if rule is None:
            continue
        node = a.get("node", "")
        message = f"serving group {a.get('group')}: {node} is the odd node on {rule.what}{where} (Prometheus rules)"
        found.append(Finding(rule.code, Status.WARNING, message, subject=f"{node} {rail}" if rail else node,
                             remedy=rule.cause))  # fmt: skip
    return Comparison(findings=tuple(sorted(found, key=lambda f: (f.code, f.subject or ""))), nodes=tuple(nodes))

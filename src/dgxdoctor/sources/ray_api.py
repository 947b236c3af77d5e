"""Pure parsers of the Ray dashboard's HTTP API (the head node's port 8265).

Shapes as Ray 2.60.0 serves them (real captures in tests/fixtures/ray/):

- ``GET /api/v0/nodes?detail=1`` (state API): ``{"result": true, "msg": "", "data": {"result": {"total": 2,
  "result": [{"node_id", "node_ip", "is_head_node", "state": "ALIVE"|"DEAD", "state_message",
  "resources_total": {"GPU": 8.0, ...}, "end_time_ms"}, ...]}}}``
- ``GET /api/cluster_status`` (autoscaler report): ``data.clusterStatus.loadMetricsReport`` holds
  ``usage`` (``{"GPU": [used, total]}``), ``resourceDemand`` (``[[{"GPU": 32.0}, 1]]``) and ``pgDemand``
  (``[[{"bundles": [[{"GPU": 8.0}, 2]], "strategy": "STRICT_SPREAD"}, 1]]``).
- ``GET /nodes?view=summary``: ``data.summary[].raylet`` with camelCase ``nodeId``, ``nodeManagerAddress``,
  ``state``, ``stateMessage``, ``isHeadNode``, ``resourcesTotal``.
- ``GET /api/version``: ``{"ray_version": "2.60.0", ...}``.

Every function raises :class:`RayApiError` naming what is wrong when the payload is not what Ray sends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from msgspec import Struct

NODES_DETAIL_PATH = "/api/v0/nodes?detail=1"
CLUSTER_STATUS_PATH = "/api/cluster_status"
NODES_SUMMARY_PATH = "/nodes?view=summary"
VERSION_PATH = "/api/version"

ALIVE = "ALIVE"
DEAD = "DEAD"


class RayApiError(ValueError):
    """A dashboard payload that is not valid JSON, reports failure, or lacks what Ray always sends."""


class RayNode(Struct, frozen=True):
    node_id: str
    node_ip: str
    state: str
    state_message: str | None = None
    is_head: bool = False
    # Logical GPUs the node registered with (``--num-gpus``); 0.0 when it has none.
    gpus: float = 0.0

    @property
    def alive(self) -> bool:
        return self.state == ALIVE


DemandKind = Literal["tasks", "placement_group", "request_resources"]


class Demand(Struct, frozen=True):
    """Resources that something waits for: ``shape`` printed as ``ray status`` prints it, ``count`` of them.

    ``gpus`` is what one of them needs: one task's GPUs, or all the bundles of one placement group.
    """

    kind: DemandKind
    shape: str
    count: int
    gpus: float = 0.0
    # The ``ray status`` line it was read from, when it came from text.
    line: str | None = None


class ClusterStatus(Struct, frozen=True):
    """What the autoscaler report says: GPU usage and what is waiting for resources."""

    gpus_used: float | None = None
    gpus_total: float | None = None
    demands: tuple[Demand, ...] = ()


class ClusterView(Struct, frozen=True):
    """One picture of the cluster, from the API or from ``ray status`` text. ``None`` means not known."""

    nodes: tuple[RayNode, ...] = ()
    nodes_alive: int | None = None
    gpus_total: float | None = None
    gpus_used: float | None = None
    demands: tuple[Demand, ...] = ()
    # Lines naming failed nodes (``ray status`` "Recent failures"), when nodes are known only by text.
    failures: tuple[str, ...] = ()

    @property
    def dead_nodes(self) -> tuple[RayNode, ...]:
        return tuple(n for n in self.nodes if n.state == DEAD)

    @property
    def pending_tasks(self) -> tuple[Demand, ...]:
        return tuple(d for d in self.demands if d.kind == "tasks")

    @property
    def pending_placement_groups(self) -> tuple[Demand, ...]:
        return tuple(d for d in self.demands if d.kind == "placement_group")


def _load(payload: str | bytes, what: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        text = payload if isinstance(payload, str) else payload[:200].decode("utf-8", "replace")
        raise RayApiError(f"{what}: not JSON ({exc}); starts with {text[:80]!r}") from None


def _envelope(payload: str | bytes, what: str) -> Mapping[str, Any]:
    """The dashboard's ``{"result": bool, "msg": str, "data": {...}}`` wrapper."""
    doc = _load(payload, what)
    if not isinstance(doc, dict):
        raise RayApiError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("result") is not True:
        raise RayApiError(f"{what}: dashboard reported failure: {doc.get('msg') or 'no message'}")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise RayApiError(f"{what}: no 'data' object")
    return data


def _get(obj: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise RayApiError(f"{what}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise RayApiError(f"{what}: {key!r} is {type(value).__name__}, not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def _gpus(resources: Any, what: str) -> float:
    if resources is None:
        return 0.0
    if not isinstance(resources, dict):
        raise RayApiError(f"{what}: resources is {type(resources).__name__}, not an object")
    value = resources.get("GPU", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RayApiError(f"{what}: GPU resource is {value!r}, not a number")
    return float(value)


def parse_nodes_detail(payload: str | bytes) -> tuple[RayNode, ...]:
    """``/api/v0/nodes?detail=1`` -> every node the GCS knows, dead ones included."""
    what = NODES_DETAIL_PATH
    data = _envelope(payload, what)
    listing = _get(data, "result", dict, what)
    rows = _get(listing, "result", list, what)
    nodes = []
    for i, row in enumerate(rows):
        where = f"{what} node #{i}"
        state = _get(row, "state", str, where)
        message = row.get("state_message")
        nodes.append(
            RayNode(
                node_id=_get(row, "node_id", str, where),
                node_ip=str(row.get("node_ip") or ""),
                state=state,
                state_message=message if isinstance(message, str) and message else None,
                is_head=row.get("is_head_node") is True,
                gpus=_gpus(row.get("resources_total"), where),
            )
        )
    return tuple(nodes)


def parse_nodes_summary(payload: str | bytes) -> tuple[RayNode, ...]:
    """``/nodes?view=summary`` -> the nodes the dashboard lists (older Ray releases have only this)."""
    what = NODES_SUMMARY_PATH
    data = _envelope(payload, what)
    rows = _get(data, "summary", list, what)
    nodes = []
    for i, row in enumerate(rows):
        where = f"{what} node #{i}"
        raylet = _get(row, "raylet", dict, where)
        message = raylet.get("stateMessage")
        nodes.append(
            RayNode(
                node_id=_get(raylet, "nodeId", str, where),
                node_ip=str(raylet.get("nodeManagerAddress") or row.get("ip") or ""),
                state=_get(raylet, "state", str, where),
                state_message=message if isinstance(message, str) and message else None,
                is_head=raylet.get("isHeadNode") is True,
                gpus=_gpus(raylet.get("resourcesTotal"), where),
            )
        )
    return tuple(nodes)


def format_shape(resources: Mapping[str, Any]) -> str:
    """``{'CPU': 0.001, 'GPU': 8.0}``, as ``ray status`` prints a demand (sorted keys, Python repr)."""
    return "{" + ", ".join(f"{k!r}: {float(v)!r}" for k, v in sorted(resources.items())) + "}"


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RayApiError(f"{where}: count {value!r} is not a number")
    return int(value)


def _shape_pair(item: Any, where: str) -> tuple[Mapping[str, Any], int]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], dict)):
        raise RayApiError(f"{where}: expected [resources, count], got {item!r:.80}")
    return item[0], _count(item[1], where)


def _shape(item: Any, where: str) -> tuple[Mapping[str, Any], int]:
    """A ``[resources, count]`` pair whose resources are all amounts (numbers)."""
    resources, count = _shape_pair(item, where)
    for name, amount in resources.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise RayApiError(f"{where}: resource {name!r} is {amount!r:.40}, not a number")
    return resources, count


def _resource_demands(items: Any, where: str, kind: DemandKind) -> list[Demand]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise RayApiError(f"{where}: not a list")
    demands = []
    for item in items:
        shape, count = _shape(item, where)
        demands.append(Demand(kind, format_shape(shape), count, _gpus(shape, where)))
    return demands


def _pg_demands(items: Any, where: str) -> list[Demand]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise RayApiError(f"{where}: not a list")
    demands = []
    for item in items:
        group, count = _shape_pair(item, where)
        bundles = _get(group, "bundles", list, where)
        parts = []
        gpus = 0.0
        for bundle in bundles:
            shape, n = _shape(bundle, f"{where} bundle")
            parts.append(f"{format_shape(shape)} * {n}")
            gpus += _gpus(shape, where) * n
        strategy = group.get("strategy")
        text = ", ".join(parts) + (f" ({strategy})" if isinstance(strategy, str) and strategy else "")
        demands.append(Demand("placement_group", text, count, gpus))
    return demands


def _usage(usage: Mapping[str, Any], key: str, where: str) -> tuple[float | None, float | None]:
    pair = usage.get(key)
    if pair is None:
        return None, None
    if not (
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
    ):
        raise RayApiError(f"{where}: usage of {key} is {pair!r:.80}, not [used, total]")
    return float(pair[0]), float(pair[1])


def parse_cluster_status(payload: str | bytes) -> ClusterStatus:
    """``/api/cluster_status`` -> GPU usage and pending resource demands / placement groups."""
    what = CLUSTER_STATUS_PATH
    data = _envelope(payload, what)
    status = data.get("clusterStatus")
    if status is None:
        # The autoscaler has not reported yet (the first seconds after the head starts).
        return ClusterStatus()
    if not isinstance(status, dict):
        raise RayApiError(f"{what}: clusterStatus is {type(status).__name__}, not an object")
    report = _get(status, "loadMetricsReport", dict, f"{what} clusterStatus")
    where = f"{what} loadMetricsReport"
    usage = report.get("usage") or {}
    if not isinstance(usage, dict):
        raise RayApiError(f"{where}: usage is not an object")
    used, total = _usage(usage, "GPU", where)
    if total is None and usage:
        # A cluster registered without any GPU: the usage map has no GPU key at all.
        used, total = 0.0, 0.0
    demands = _resource_demands(report.get("resourceDemand"), f"{where} resourceDemand", "tasks")
    demands += _pg_demands(report.get("pgDemand"), f"{where} pgDemand")
    demands += _resource_demands(report.get("requestDemand"), f"{where} requestDemand", "request_resources")
    return ClusterStatus(gpus_used=used, gpus_total=total, demands=tuple(demands))


def parse_version(payload: str | bytes) -> str | None:
    """``/api/version`` -> the cluster's Ray version, or None when the payload does not say."""
    doc = _load(payload, VERSION_PATH)
    if not isinstance(doc, dict):
        raise RayApiError(f"{VERSION_PATH}: expected a JSON object, got {type(doc).__name__}")
    version = doc.get("ray_version")
    return version if isinstance(version, str) and version else None


def cluster_view(nodes: Sequence[RayNode], status: ClusterStatus | None = None) -> ClusterView:
    """Combine the node list and the autoscaler report. GPUs total counts ALIVE nodes' registered GPUs."""
    alive = [n for n in nodes if n.alive]
    gpus_total = sum(n.gpus for n in alive)
    gpus_used = status.gpus_used if status is not None else None
    return ClusterView(
        nodes=tuple(nodes),
        nodes_alive=len(alive),
        gpus_total=gpus_total,
        gpus_used=gpus_used,
        demands=status.demands if status is not None else (),
    )

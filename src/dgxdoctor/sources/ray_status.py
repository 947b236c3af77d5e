"""Pure parser of what ``ray status`` prints (the autoscaler status report).

Formats read (each one has a fixture in tests/fixtures/ray/, sources in SOURCES.md):
- Ray 2.60.0 (captured here): "Active:" nodes, "Total Usage:", "From request_resources:", "Pending Demands:".
- Ray 2.8+ with autoscaler v2 idle reporting: "Active:" and "Idle:" nodes, "Total Demands:".
- Ray 1.x-2.7: "Healthy:" nodes, "Total Demands:"; Ray 1.2-era: "Usage:" and "Demands:".
The layout is produced by ``ray.autoscaler._private.util.format_info_string``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dgxdoctor.sources.ray_api import ClusterView, Demand, DemandKind


class RayStatusError(ValueError):
    """Text that is not ``ray status`` output."""


# ======== Autoscaler status: 2026-11-30 01:59:21.820618 ========
HEADER_RE = re.compile(r"^=+ Autoscaler status: (?P<ts>.+?) =+$")
# " 1 node_7cf0e4d13538d46a83b175ecc2c9162830812885b35ce9a2a1d7170c" (under Active:, Healthy: or Idle:)
NODE_COUNT_RE = re.compile(r"^\s+(?P<count>\d{1,18}) (?P<name>\S.*)$")
# " 0.0/16.0 GPU", " 2/2 GPU", " 0B/31.36GiB memory", " 0.00/19.915 GiB memory", " 1/2 AcceleratorType:V100"
USAGE_RE = re.compile(
    r"^\s+(?P<used>\d+(?:\.\d+)?)(?P<used_unit>[A-Za-z]*)/(?P<total>\d+(?:\.\d+)?)\s?(?P<total_unit>[A-Za-z]*)"
    r"\s+(?P<resource>\S+)$"
)
# " {'GPU': 32.0}: 1+ pending tasks/actors"
# " {'CPU': 0.001, 'GPU': 8.0} * 2, {'GPU': 8.0} * 1 (STRICT_SPREAD): 1+ pending placement groups"
# " {'CPU': 16}: 100+ from request_resources()"
DEMAND_RE = re.compile(
    r"^\s+(?P<shape>\{.*\S)\s*:\s*(?P<count>\d{1,18})\+?\s+"
    r"(?P<what>pending tasks/actors|pending placement groups|from request_resources\(\))\s*$"
)
# "{'CPU': 0.001, 'GPU': 8.0} * 2" inside a demand's shape
BUNDLE_RE = re.compile(r"\{(?P<resources>[^{}]*)\}(?:\s*\*\s*(?P<n>\d{1,18})\b)?")
# "'GPU': 8.0" inside a bundle
GPU_IN_BUNDLE_RE = re.compile(r"'GPU':\s*(?P<gpus>\d+(?:\.\d+)?)")

_KINDS: dict[str, DemandKind] = {
    "pending tasks/actors": "tasks",
    "pending placement groups": "placement_group",
    "from request_resources()": "request_resources",
}
_NODE_SECTIONS = {"Active:", "Healthy:", "Idle:"}
_USAGE_SECTIONS = {"Total Usage:", "Usage:"}
_DEMAND_SECTIONS = {"Total Demands:", "Demands:", "Pending Demands:", "From request_resources:"}


@dataclass(frozen=True)
class Usage:
    used: float
    total: float
    line: str


@dataclass(frozen=True)
class RayStatusReport:
    timestamp: str | None
    nodes: tuple[tuple[int, str], ...]
    pending_nodes: tuple[str, ...]
    failures: tuple[str, ...]
    usage: dict[str, Usage]
    demands: tuple[Demand, ...]

    @property
    def nodes_alive(self) -> int:
        return sum(count for count, _ in self.nodes)

    def view(self) -> ClusterView:
        gpu = self.usage.get("GPU")
        # Usage lists GPU only when some node has GPUs; a GPU-less cluster has 0, not "unknown".
        return ClusterView(
            nodes_alive=self.nodes_alive,
            gpus_total=gpu.total if gpu else 0.0,
            gpus_used=gpu.used if gpu else 0.0,
            demands=self.demands,
            failures=self.failures,
        )


def _bundle_gpus(shape: str) -> float:
    total = 0.0
    for bundle in BUNDLE_RE.finditer(shape):
        gpu = GPU_IN_BUNDLE_RE.search(bundle.group("resources"))
        if gpu:
            total += float(gpu.group("gpus")) * int(bundle.group("n") or 1)
    return total


def looks_like_ray_status(text: str) -> bool:
    """Cheap test: the autoscaler banner, or both of its section titles near the top."""
    head = text[:4096]
    lines = [line.strip() for line in head.splitlines()[:5]]
    if any(HEADER_RE.match(line) for line in lines):
        return True
    return "\nNode status\n" in head and "\nResources\n" in head


def parse_ray_status(text: str) -> RayStatusReport:
    """Parse ``ray status`` (plain or ``-v``). Only the cluster totals are read, not the per-node sections."""
    timestamp = None
    section = ""
    saw_node_status = saw_resources = False
    nodes: list[tuple[int, str]] = []
    pending: list[str] = []
    failures: list[str] = []
    usage: dict[str, Usage] = {}
    demands: list[Demand] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or set(stripped) == {"-"}:
            continue
        header = HEADER_RE.match(stripped)
        if header:
            timestamp = header.group("ts")
            continue
        if stripped.startswith("Node: ") and not line.startswith(" "):
            # Per-node sections of `ray status -v`: the cluster totals are above them.
            break
        if not line.startswith(" "):
            section = stripped
            saw_node_status |= stripped == "Node status"
            saw_resources |= stripped == "Resources"
            continue
        if stripped.startswith("(") and stripped.endswith(")"):
            continue  # "(no pending nodes)", "(no failures)", "(none)", "(no resource demands)"
        if section in _NODE_SECTIONS:
            m = NODE_COUNT_RE.match(line)
            if m is None:
                raise RayStatusError(f"ray status: node line not understood under {section} {stripped!r}")
            nodes.append((int(m.group("count")), m.group("name")))
        elif section == "Pending:":
            pending.append(stripped)
        elif section == "Recent failures:":
            failures.append(stripped)
        elif section in _USAGE_SECTIONS:
            m = USAGE_RE.match(line)
            if m is not None:
                usage[m.group("resource")] = Usage(float(m.group("used")), float(m.group("total")), stripped)
        elif section in _DEMAND_SECTIONS:
            m = DEMAND_RE.match(line)
            if m is None:
                raise RayStatusError(f"ray status: demand line not understood: {stripped!r}")
            shape = m.group("shape").strip()
            count = int(m.group("count"))
            kind = _KINDS[m.group("what")]
            demands.append(Demand(kind, shape, count, _bundle_gpus(shape), stripped))
    if not (saw_node_status and saw_resources):
        missing = [name for name, seen in (("Node status", saw_node_status), ("Resources", saw_resources)) if not seen]
        raise RayStatusError(f"not `ray status` output: no {' or '.join(missing)} section")
    return RayStatusReport(
        timestamp=timestamp,
        nodes=tuple(nodes),
        pending_nodes=tuple(pending),
        failures=tuple(failures),
        usage=usage,
        demands=tuple(demands),
    )

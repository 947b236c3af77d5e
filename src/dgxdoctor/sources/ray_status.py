"""Pure parser of what ``ray status`` prints (the autoscaler status report).

Formats read (each one has a fixture in tests/fixtures/ray/, sources in SOURCES.md):
- Ray 2.60.0 (captured here): "Active:" nodes, "Total Usage:", "From request_resources:", "Pending Demands:".
- Ray 2.8+ with autoscaler v2 idle reporting: "Active:" and "Idle:" nodes, "Total Demands:".
- Ray 1.x-2.7: "Healthy:" nodes, "Total Demands:"; Ray 1.2-era: "Usage:" and "Demands:".
The layout is produced by ``ray.autoscaler._private.util.format_info_string``.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from dgxdoctor.lazy_re import LazyPattern, lazy_compile
from dgxdoctor.sources.ray_api import ClusterView, Demand, DemandKind


class RayStatusError(ValueError):
    """Text that is not ``ray status`` output."""


# ======== Autoscaler status: 2026-11-30 01:59:21.820618 ========
# ======== Cluster status: 2021-08-17 01:15:02.033448 ========          (Ray 1.6, ray-project/ray#17892)
HEADER_RE = lazy_compile(r"^=+ (?:Autoscaler|Cluster) status: (?P<ts>.+?) =+$")
# Ray 1.6 listed nodes under "Node status" with no Healthy:/Active: heading:
#  1 node(s) with resources: {'node:192.168.86.195': 1.0, 'CPU': 16.0, ...}
NODE_WITH_RESOURCES_RE = lazy_compile(r"^\s*(?P<count>\d{1,18}) node\(s\) with resources: (?P<name>\{.*\})\s*$")
# " 1 node_7cf0e4d13538d46a83b175ecc2c9162830812885b35ce9a2a1d7170c" (under Active:, Healthy: or Idle:)
NODE_COUNT_RE = lazy_compile(r"^\s*(?P<count>\d{1,18}) (?P<name>\S.*)$")
# " 0.0/16.0 GPU", " 2/2 GPU", " 0B/31.36GiB memory", " 0.00/19.915 GiB memory", " 1/2 AcceleratorType:V100"
USAGE_RE = lazy_compile(
    r"^\s*(?P<used>\d+(?:\.\d+)?)(?P<used_unit>[A-Za-z]*)/(?P<total>\d+(?:\.\d+)?)\s?(?P<total_unit>[A-Za-z]*)"
    r"\s+(?P<resource>\S+)$"
)
# " {'GPU': 32.0}: 1+ pending tasks/actors"
# " {'CPU': 0.001, 'GPU': 8.0} * 2, {'GPU': 8.0} * 1 (STRICT_SPREAD): 1+ pending placement groups"
# " {'CPU': 16}: 100+ from request_resources()"
DEMAND_RE = lazy_compile(
    r"^\s*(?P<shape>\{.*\S)\s*:\s*(?P<count>\d{1,18})\+?\s+"
    r"(?P<what>pending tasks/actors|pending placement groups|from request_resources\(\))\s*$"
)
# "{'CPU': 0.001, 'GPU': 8.0} * 2" inside a demand's shape
BUNDLE_RE = lazy_compile(r"\{(?P<resources>[^{}]*)\}(?:\s*\*\s*(?P<n>\d{1,18})\b)?")
# "'GPU': 8.0" inside a bundle
GPU_IN_BUNDLE_RE = lazy_compile(r"'GPU':\s*(?P<gpus>\d+(?:\.\d+)?)")

_KINDS: dict[str, DemandKind] = {
    "pending tasks/actors": "tasks",
    "pending placement groups": "placement_group",
    "from request_resources()": "request_resources",
}
_NODE_SECTIONS = {"Active:", "Healthy:", "Idle:"}
_USAGE_SECTIONS = {"Total Usage:", "Usage:"}
_DEMAND_SECTIONS = {"Total Demands:", "Demands:", "Pending Demands:", "From request_resources:"}
_TITLES = {"Node status", "Resources"}
_ALL_SECTIONS = _NODE_SECTIONS | _USAGE_SECTIONS | _DEMAND_SECTIONS | _TITLES | {"Pending:", "Recent failures:"}
# What an unindented line under each section may be (a paste that lost its indentation); anything else is a title.
_CONTENT: dict[str, LazyPattern] = {
    **dict.fromkeys(_NODE_SECTIONS, NODE_COUNT_RE),
    **dict.fromkeys(_USAGE_SECTIONS, USAGE_RE),
    **dict.fromkeys(_DEMAND_SECTIONS, DEMAND_RE),
}

# Fragments: a section title over its dashes; a usage, node or demand heading followed by one line of its kind.
#   Resources
#   ---------------------------------------------------------------
#   Total Usage:
#    0.0/16.0 GPU
#   Pending Demands:
#    {'GPU': 32.0}: 1+ pending tasks/actors
# Each after literal texts one of which every match contains, tested first: the regexes are tried at every line
# start, 80 ms over the 1 MB head of a big log that holds none of them (diagnose.stream).
_FRAGMENT_RES = (
    (("--------",), re.compile(r"^[ \t]*(?:Node status|Resources)[ \t]*\r?\n[ \t]*-{8,}[ \t]*\r?$", re.M)),
    (
        ("Usage:",),
        re.compile(
            r"^[ \t]*(?:Total )?Usage:[ \t]*\r?\n"
            r"[ \t]*\d+(?:\.\d+)?[A-Za-z]*/\d+(?:\.\d+)? ?[A-Za-z]*[ \t]+\S+[ \t]*\r?$",
            re.M,
        ),
    ),
    (("node_",), re.compile(r"^[ \t]*(?:Active|Healthy|Idle):[ \t]*\r?\n[ \t]*\d{1,18} [ \t]*node_[0-9a-f]{8}", re.M)),
    (
        ("Demands:", "From request_resources:"),
        re.compile(
            r"^[ \t]*(?:(?:Total |Pending )?Demands|From request_resources):[ \t]*\r?\n[ \t]*"
            r"(?:\((?:no resource demands|none)\)|\{[^\n]{0,4000}\}[^\n]{0,4000}"
            r"(?:pending tasks/actors|pending placement groups|from request_resources\(\)))",
            re.M,
        ),
    ),
)


class Usage(Struct, frozen=True):
    used: float
    total: float
    line: str


class RayStatusReport(Struct, frozen=True):
    timestamp: str | None
    nodes: tuple[tuple[int, str], ...]
    pending_nodes: tuple[str, ...]
    failures: tuple[str, ...]
    usage: dict[str, Usage]
    demands: tuple[Demand, ...]
    # A fragment may lack the node or the usage section: what it lacks is unknown, not zero.
    nodes_known: bool = True
    usage_known: bool = True

    @property
    def nodes_alive(self) -> int | None:
        return sum(count for count, _ in self.nodes) if self.nodes_known else None

    def view(self) -> ClusterView:
        gpu = self.usage.get("GPU")
        # Usage lists GPU only when some node has GPUs; a GPU-less cluster has 0, not "unknown".
        none_listed = 0.0 if self.usage_known else None
        return ClusterView(
            nodes_alive=self.nodes_alive,
            gpus_total=gpu.total if gpu else none_listed,
            gpus_used=gpu.used if gpu else none_listed,
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
    """Cheap test, true of fragments too: the banner, a section title over its dashes, or a usage, demand or
    node heading followed by a line of its kind (anywhere: a log may embed the output)."""
    if " status: " in text and any(HEADER_RE.match(line.strip()) for line in text.splitlines()):
        return True
    return any(any(t in text for t in literals) and r.search(text) is not None for literals, r in _FRAGMENT_RES)


def parse_ray_status(text: str) -> RayStatusReport:
    """Parse ``ray status`` (plain or ``-v``), whole or a fragment; only the cluster totals, not the per-node
    sections. What a fragment lacks stays unknown (``nodes_known``/``usage_known``). Of several reports (a
    monitor.log, a paste of a watch loop), the last one: earlier ones would add their nodes to its count."""
    state = _State()
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or set(stripped) == {"-"}:
            continue
        header = HEADER_RE.match(stripped)
        if header:
            if state.seen:  # another report after one read (Ray's monitor.log prints one every few seconds)
                state = _State()  # the latest is the cluster's state; the ones before it are its past
            state.timestamp = header.group("ts")
            continue
        if stripped.startswith("Node: ") and not line.startswith(" ") and state.seen:
            # Per-node sections of `ray status -v`: the cluster totals are above them.
            break
        if _is_heading(line, stripped, state.section):
            state.section = stripped
            if stripped in _ALL_SECTIONS:
                state.seen.add(stripped)
            continue
        state.read(line, stripped)
    if not state.seen:
        raise RayStatusError("not `ray status` output: no Node status, Resources, Usage or Demands section")
    return RayStatusReport(
        timestamp=state.timestamp,
        nodes=tuple(state.nodes),
        pending_nodes=tuple(state.pending),
        failures=tuple(state.failures),
        usage=state.usage,
        demands=tuple(state.demands),
        nodes_known=state.nodes_known,
        usage_known=state.usage_known,
    )


def _is_heading(line: str, stripped: str, section: str) -> bool:
    """A section title: a known one, or an unindented line that is not content of the current section."""
    if stripped in _ALL_SECTIONS:
        return True
    if line.startswith((" ", "\t")):
        return False
    if stripped.startswith("(") and stripped.endswith(")"):
        return False
    content = _CONTENT.get(section)
    return content is None or content.match(line) is None


class _State(Struct):
    timestamp: str | None = None
    section: str = ""
    seen: set[str] = field(default_factory=set)
    nodes: list[tuple[int, str]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    usage: dict[str, Usage] = field(default_factory=dict)
    demands: list[Demand] = field(default_factory=list)

    nodes_listed: bool = False

    @property
    def nodes_known(self) -> bool:
        return self.nodes_listed or bool(self.seen & _NODE_SECTIONS)

    @property
    def usage_known(self) -> bool:
        return bool(self.seen & _USAGE_SECTIONS)

    def read(self, line: str, stripped: str) -> None:
        section = self.section
        if stripped.startswith("(") and stripped.endswith(")"):
            return  # "(no pending nodes)", "(no failures)", "(none)", "(no resource demands)"
        if section == "Node status":
            listed = NODE_WITH_RESOURCES_RE.match(line)
            if listed is not None:
                self.nodes_listed = True
                self.nodes.append((int(listed.group("count")), listed.group("name")))
        elif section in _NODE_SECTIONS:
            m = NODE_COUNT_RE.match(line)
            if m is None:
                raise RayStatusError(f"ray status: node line not understood under {section} {stripped!r}")
            self.nodes.append((int(m.group("count")), m.group("name")))
        elif section == "Pending:":
            self.pending.append(stripped)
        elif section == "Recent failures:":
            self.failures.append(stripped)
        elif section in _USAGE_SECTIONS:
            m = USAGE_RE.match(line)
            if m is not None:
                self.usage[m.group("resource")] = Usage(float(m.group("used")), float(m.group("total")), stripped)
        elif section in _DEMAND_SECTIONS:
            m = DEMAND_RE.match(line)
            if m is None:
                raise RayStatusError(f"ray status: demand line not understood: {stripped!r}")
            shape = m.group("shape").strip()
            kind = _KINDS[m.group("what")]
            self.demands.append(Demand(kind, shape, int(m.group("count")), _bundle_gpus(shape), stripped))

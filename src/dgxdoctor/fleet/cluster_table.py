"""``dgxdoctor check --cluster``: the nodes side by side per check, then what is wrong where, then the comparison."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any

from dgxdoctor.documents import FindingDoc
from dgxdoctor.fleet.cluster import ClusterView, NodeRun
from dgxdoctor.fleet.compare import told_by_the_comparison

MARK = {"ok": "OK", "warning": "WARN", "critical": "CRIT", "unknown": "UNKN", "skipped": "SKIP"}
QUIET = ("ok", "skipped")


def _mark(status: str) -> str:
    return MARK.get(status, status[:4].upper())


def _checks(nodes: tuple[NodeRun, ...]) -> list[str]:
    """Every check any node ran, in the order the first node to run it lists them."""
    names: list[str] = []
    for n in nodes:
        for c in (n.doc or {}).get("checks", []):
            if c["name"] not in names:
                names.append(c["name"])
    return names


def _node_line(n: NodeRun, width: int) -> str:
    group = (n.doc or {}).get("group")
    grouped = f"group {group}: " if group else ""
    if n.url is None:
        where = f"{grouped}this node"
    elif n.source == "prometheus":
        where = f"{grouped}{n.url} (Prometheus: codes and subjects{'; ' + str(n.error) if n.error else ''})"
    elif n.doc is None:
        where = f"{n.url}: UNREACHABLE: {n.error}"
    else:
        offset = "" if n.clock_offset_s is None else f", clock {n.clock_offset_s:+.3f} s (rtt {n.rtt_s or 0:.3f} s)"
        where = f"{grouped}{n.url}{' (cached results)' if n.cached else ''}{offset}"
    return f"{n.node:<{width}}  {_mark(n.status.value):<4}  {n.seconds:>6.2f}s  {where}"


def cluster_table(view: ClusterView, verbose: bool = False) -> str:
    term = max(60, min(shutil.get_terminal_size((120, 24)).columns, 160))
    nodes = view.nodes
    node_w = max([len(n.node) for n in nodes] + [4])
    lines = [f"dgxdoctor cluster of {len(nodes)} node(s): {view.status.value.upper()}", ""]
    lines.append(f"{'NODE':<{node_w}}  {'STAT':<4}  {'TIME':>7}  SOURCE")
    lines += [_node_line(n, node_w) for n in nodes]
    names = _checks(nodes)
    col = max([len(n.node) for n in nodes] + [4])
    check_w = max([len(c) for c in names] + [5])
    lines += ["", f"{'CHECK':<{check_w}}  " + "  ".join(f"{n.node:<{col}}" for n in nodes)]
    by_node = [{c["name"]: c for c in (n.doc or {}).get("checks", [])} for n in nodes]
    for name in names:
        cells = []
        for n, checks in zip(nodes, by_node, strict=True):
            got = checks.get(name)
            cells.append(_mark(got["status"]) if got else ("UNKN" if n.doc is None else "-"))
        lines.append(f"{name:<{check_w}}  " + "  ".join(f"{c:<{col}}" for c in cells))
    lines += _details(nodes, by_node, verbose, term, compared=len(view.comparison.nodes) >= 2)
    lines += _comparison(view, term)
    return "\n".join(lines)


def _details(
    nodes: tuple[NodeRun, ...], by_node: list[dict[str, Any]], verbose: bool, width: int, compared: bool
) -> list[str]:
    """Each node's checks that are not ok, each finding with its own remedy; where the nodes were ``compared`` here,
    the comparison's verdicts that a peer's own peer_compare check gives too are left to it (listed once)."""
    out: list[str] = []
    for n, checks in zip(nodes, by_node, strict=True):
        for c in checks.values():
            if c["status"] in QUIET and not verbose:
                continue
            told = [f for f in c.get("findings", []) if compared and told_by_the_comparison(c["name"], f["code"])]
            shown = [f for f in c.get("findings", []) if (verbose or f["status"] not in QUIET) and f not in told]
            if told and not shown:
                continue
            out.extend(textwrap.wrap(f"{n.node} {c['name']} [{c['status']}]: {c['summary']}", width,
                                     subsequent_indent="    "))  # fmt: skip
            said: set[str] = {f["remedy"] for f in told if f.get("remedy")}
            for f in shown:
                out.extend(_finding(f, said, width))
            action = (c.get("action") or {}).get("remedy")
            if action and c["status"] not in QUIET and action not in said:
                out.extend(textwrap.wrap(f"remedy: {action}", width, initial_indent="  ",
                                         subsequent_indent="    "))  # fmt: skip
    return ["", *out] if out else []


def _finding(f: dict[str, Any], said: set[str], width: int) -> list[str]:
    """A finding and its own remedy under it, each remedy once (as ``check`` prints them, commands/report.py)."""
    subject = f"{f['subject']}: " if f.get("subject") else ""
    lines = textwrap.wrap(f"- [{f['status']}] {f['code']} {subject}{f['message']}", width, initial_indent="  ",
                          subsequent_indent="    ")  # fmt: skip
    fix = f.get("remedy")
    if fix and fix not in said and f["status"] not in QUIET:
        said.add(fix)
        lines += textwrap.wrap(f"remedy: {fix}", width, initial_indent="    ", subsequent_indent="      ")
    return lines


def _comparison(view: ClusterView, width: int) -> list[str]:
    c = view.comparison
    answered = sum(1 for n in view.nodes if n.doc is not None)
    if answered < 2:
        return ["", f"comparison: needs two nodes with results, {answered} answered"]
    head = f"comparison of {answered} nodes: {len(c.imbalances)} metric(s), {c.compared_facts} fact(s) compared"
    out = ["", f"{head}, {len(c.findings)} difference(s)"]
    said: set[str] = set()
    for f in c.findings:
        out.extend(_finding(FindingDoc.of(f).dumped(), said, width))
    return out

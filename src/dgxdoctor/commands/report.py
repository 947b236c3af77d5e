"""Render a set of check results: the one-shot table and the ``--json`` document (documents.ResultsDocument)."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from typing import Any

from dgxdoctor.result import DEFAULT_GROUP, CheckResult, Status, exit_code, overall_status


def role_note(role: str | None, results: Sequence[CheckResult]) -> str:
    """What the top line adds, so that an OK with nothing required is never mistaken for a healthy node."""
    if role is not None:
        return f"role {role}"
    skipped = sum(1 for r in results if r.status is Status.SKIPPED)
    return f"no [node] role declared: nothing was required, {skipped} of {len(results)} checks skipped"


def report_dict(
    node: str, results: Sequence[CheckResult], role: str | None = None, group: str = DEFAULT_GROUP
) -> dict[str, Any]:
    """``dgxdoctor check --json`` (documents.ResultsDocument: its models are built only for a JSON report)."""
    from dgxdoctor.documents import ResultsDocument

    return ResultsDocument.of(node, results, group=group).report(role)


_MARK = {
    Status.OK: "OK",
    Status.WARNING: "WARN",
    Status.CRITICAL: "CRIT",
    Status.UNKNOWN: "UNKN",
    Status.SKIPPED: "SKIP",
}


def report_table(node: str, results: Sequence[CheckResult], verbose: bool = False, role: str | None = None) -> str:
    """A readable table; the findings and the remedy follow each check that is not ok."""
    width = max(60, min(shutil.get_terminal_size((120, 24)).columns, 160))
    name_w = max([len(r.check) for r in results] + [5])
    top = f"dgxdoctor on {node}: {overall_status(results).value.upper()} ({role_note(role, results)})"
    lines = [top, ""]
    lines.append(f"{'STATUS':<6}  {'CHECK':<{name_w}}  {'TIME':>6}  SUMMARY")
    indent = " " * (6 + 2 + name_w + 2 + 6 + 2)
    for r in results:
        head = f"{_MARK[r.status]:<6}  {r.check:<{name_w}}  {r.duration_s:>5.2f}s  "
        lines.extend(textwrap.wrap(r.summary, width, initial_indent=head, subsequent_indent=indent) or [head])
        lines.extend(_finding_lines(r, verbose, width, indent))
    return "\n".join(lines)


def _finding_lines(r: CheckResult, verbose: bool, width: int, indent: str) -> list[str]:
    """Each shown finding, with its own remedy under it (each remedy once); then the check's action if new."""
    lines: list[str] = []
    said: set[str] = set()
    show = verbose or r.status not in (Status.OK, Status.SKIPPED)
    for f in r.findings:
        if not (show and (verbose or f.status not in (Status.OK, Status.SKIPPED))):
            continue
        subject = f"{f.subject}: " if f.subject else ""
        text = f"- [{f.status.value}] {f.code} {subject}{f.message}"
        lines.extend(textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  "))
        if f.remedy and f.remedy not in said and f.status in (Status.WARNING, Status.CRITICAL, Status.UNKNOWN):
            said.add(f.remedy)
            lines.extend(
                textwrap.wrap(
                    f"remedy: {f.remedy}", width, initial_indent=indent + "  ", subsequent_indent=indent + "    "
                )
            )
    if r.action and r.status not in (Status.OK, Status.SKIPPED) and r.action.remedy not in said:
        lines.extend(
            textwrap.wrap(f"remedy: {r.action.remedy}", width, initial_indent=indent, subsequent_indent=indent + "  ")
        )
    return lines


def _source(name: str) -> str:
    return "<stdin>" if name == "-" else name


def diagnose_dict(inputs: Sequence[tuple[str, Any]], worst: Status) -> dict[str, Any]:
    """``diagnose --json``: the status and exit code overall, and each reading (source, kind, status, findings)."""
    return {
        "status": worst.value,
        "exit_code": exit_code(worst),
        "inputs": [
            {
                "source": _source(name),
                "kind": d.kind,
                "status": d.status.value,
                "summary": d.summary,
                "findings": [f.to_diagnose_dict() for f in d.findings],
                "data": d.data,
            }
            for name, d in inputs
        ],
    }


def diagnose_text(inputs: Sequence[tuple[str, Any]]) -> str:
    lines: list[str] = []
    for name, d in inputs:
        lines.append(f"{_source(name)}: {d.kind}, {d.status.value}")
        if d.summary:
            lines.append(f"  {d.summary}")
        for f in d.findings:
            subject = f"{f.subject}: " if f.subject else ""
            lines.append(f"  [{f.status.value}] {f.code} {subject}{f.message}")
            if f.evidence:
                lines.append(f"      evidence: {f.evidence}")
            if f.remedy:
                lines.append(f"      remedy: {f.remedy}")
    return "\n".join(lines)

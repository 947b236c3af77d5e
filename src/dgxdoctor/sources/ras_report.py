"""NCCL RAS status reports (``ncclras`` output, text or ``-f json``) -> data. Parsing only; no verdicts.

Built from NCCL's own format strings (src/ras/client_support.cc; line numbers at v2.28.9-1 unless marked, the
NCCL that torch 2.11 ships, with the 2.24.3-1 variants where the words differ). A rank's ``host`` is the IP address
of its RAS socket (ncclSocketToHost: "the port part is ignored and no DNS resolution is attempted").
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile

IssueKind = Literal["unresponsive", "dead", "nocomm", "error", "status", "behind"]


class RankIssue(Struct, frozen=True):
    """A rank or process RAS reports as not well, with NCCL's own lines about it as ``evidence``.

    unresponsive: RAS got no data from its process; dead: RAS considers the process dead ("unreachable via the
    RAS network"); nocomm: the process answered but no longer has the communicator; error: an initialisation or
    asynchronous NCCL error; status: its status differs from the other ranks'; behind: it launched fewer
    operations than the others. ``rank`` is None for a process-level line (no communicator rank).
    """

    kind: IssueKind
    comm: str
    rank: int | None
    host: str | None
    pid: int | None
    gpus: tuple[int, ...]
    evidence: str
    nvml_gpus: tuple[int, ...] = ()


class RankInfo(Struct, frozen=True):
    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    collective_counts: dict[str, int] = field(default_factory=dict)


class Communicator(Struct, frozen=True):
    """One communicator (JSON) or one group of alike communicators (text: ``count`` of them).

    ``size`` is commNRanks; ``nodes`` and ``ranks_per_node`` count the distinct RAS hosts of its ranks.
    """

    key: str
    size: int
    nodes: int
    ranks_per_node: tuple[int, int]
    count: int = 1
    status: str = ""
    errors: str = ""
    ranks: tuple[RankInfo, ...] = ()
    missing: int = 0


class RasReport(Struct, frozen=True):
    format: str
    nccl_version: str | None = None
    cuda_runtime: int | None = None
    cuda_driver: int | None = None
    nodes: int | None = None
    processes: int | None = None
    gpus: int | None = None
    communicators: tuple[Communicator, ...] = ()
    issues: tuple[RankIssue, ...] = ()
    timeouts: int = 0
    collection_s: float | None = None

    def serving(self) -> Communicator | None:
        """The largest communicator: vLLM's world group spans every tensor- and pipeline-parallel rank."""
        return max(self.communicators, key=lambda c: (c.size, c.nodes), default=None)


class RasReportError(ValueError):
    pass


def parse_report(text: str) -> RasReport:
    """A report in either format (JSON when it starts with ``{``); RasReportError names what is wrong."""
    stripped = text.lstrip()
    try:
        if stripped.startswith("{"):
            return parse_json_report(stripped)
        return parse_text_report(text)
    except RasReportError:
        raise
    except ValueError as exc:  # a number int() refuses: more digits than Python converts (4300), say
        raise RasReportError(f"RAS report has a number that cannot be read: {str(exc)[:120]}") from exc


# ---------------------------------------------------------------------------------------------------- JSON


def _int(obj: dict[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RasReportError(f"RAS JSON {where}: {key!r} is not an integer ({value!r})")
    return value


def _spread(hosts: list[str]) -> tuple[int, tuple[int, int]]:
    per: dict[str, int] = {}
    for host in hosts:
        per[host] = per.get(host, 0) + 1
    if not per:
        return 0, (0, 0)
    return len(per), (min(per.values()), max(per.values()))


def _json_rank(obj: Any, where: str) -> RankInfo:
    if not isinstance(obj, dict):
        raise RasReportError(f"RAS JSON {where}: a rank is not an object")
    counts = obj.get("collective_counts")
    ops = {str(k): v for k, v in counts.items() if isinstance(v, int)} if isinstance(counts, dict) else {}
    host = obj.get("host")
    return RankInfo(
        _int(obj, "rank", where),
        str(host) if isinstance(host, str) else "unknown",
        _int(obj, "pid", where),
        _int(obj, "cuda_dev", where),
        _int(obj, "nvml_dev", where),
        ops,
    )


def _json_missing(obj: Any, comm: str) -> RankIssue:
    """client_support.cc:1941-1960 (jsonWriteMissingRank): unresponsive / considered_dead per missing rank."""
    rank = _json_rank({**obj, "collective_counts": {}} if isinstance(obj, dict) else obj, f"{comm} missing rank")
    status = obj.get("status") if isinstance(obj, dict) else None
    status = status if isinstance(status, dict) else {}
    dead, unresponsive = status.get("considered_dead") is True, status.get("unresponsive") is True
    kind: IssueKind = "dead" if dead else "unresponsive" if unresponsive else "nocomm"
    words = {"dead": "considered dead", "unresponsive": "unresponsive", "nocomm": "not a member any more"}[kind]
    evidence = (
        f'communicator {comm}: missing rank {rank.rank} ({words}; "unresponsive": '
        f'{str(unresponsive).lower()}, "considered_dead": {str(dead).lower()}) -- GPU {rank.cuda_dev} '
        f"managed by process {rank.pid} on node {rank.host}"
    )
    pid = rank.pid if rank.pid >= 0 else None
    host = rank.host if rank.host != "unknown" else None
    return RankIssue(kind, comm, rank.rank, host, pid, (rank.cuda_dev,), evidence, (rank.nvml_dev,))


def _behind(comm: str, ranks: tuple[RankInfo, ...]) -> list[RankIssue]:
    """Ranks that launched fewer operations of a kind than the most advanced rank (RAS_ACE_MISMATCH's counts)."""
    issues: list[RankIssue] = []
    for op in sorted({op for r in ranks for op in r.collective_counts}):
        top = max(r.collective_counts.get(op, 0) for r in ranks)
        for r in ranks:
            count = r.collective_counts.get(op, 0)
            if count < top:
                evidence = (
                    f"communicator {comm}: rank {r.rank} has launched up to {op} operation {count} while others "
                    f"reached {top} -- GPU {r.cuda_dev} managed by process {r.pid} on node {r.host}"
                )
                issues.append(RankIssue("behind", comm, r.rank, r.host, r.pid, (r.cuda_dev,), evidence, (r.nvml_dev,)))
    return issues


def _json_comm(obj: Any, index: int) -> tuple[Communicator, list[RankIssue]]:
    if not isinstance(obj, dict):
        raise RasReportError(f"RAS JSON communicator {index} is not an object")
    key = str(obj.get("hash", f"#{index}"))
    ranks_raw, missing_raw = obj.get("ranks", []), obj.get("missing_ranks", [])
    if not isinstance(ranks_raw, list) or not isinstance(missing_raw, list):
        raise RasReportError(f"RAS JSON communicator {key}: ranks / missing_ranks are not lists")
    ranks = tuple(_json_rank(r, f"communicator {key}") for r in ranks_raw)
    issues = [_json_missing(m, key) for m in missing_raw]
    issues.extend(_behind(key, ranks))
    hosts = [r.host for r in ranks] + [i.host or "unknown" for i in issues if i.kind != "behind"]
    nodes, per_node = _spread(hosts)
    comm = Communicator(key, _int(obj, "size", f"communicator {key}"), nodes, per_node, ranks=ranks,
                        missing=len(missing_raw))  # fmt: skip
    return comm, issues


# 2.28's missing-rank object lacks a comma: '"nvml_dev": 3\n          "status": {' (client_support.cc:1963 at
# v2.28.9-1, fixed by 2.29.2-1 :2010), so its JSON is invalid exactly when a rank is missing. Only this gap is mended.
MISSING_COMMA_RE = lazy_compile(r'("nvml_dev": -?\d+)(\n {10}"status": \{)')


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        mended = MISSING_COMMA_RE.sub(r"\1,\2", text)
        if mended == text:
            raise RasReportError(f"RAS JSON report does not parse: {exc}") from exc
    try:
        return json.loads(mended)
    except (ValueError, RecursionError) as exc:
        raise RasReportError(f"RAS JSON report does not parse: {exc}") from exc


def parse_json_report(text: str) -> RasReport:
    """``SET FORMAT json`` reports (client_support.cc:1888-1990, rasDumpCommsToJSON, from 2.28.7)."""
    data = _load_json(text)
    if not isinstance(data, dict) or not isinstance(data.get("communicators"), list):
        raise RasReportError("RAS JSON report has no 'communicators' list")
    comms: list[Communicator] = []
    issues: list[RankIssue] = []
    for index, obj in enumerate(data["communicators"]):
        comm, found = _json_comm(obj, index)
        comms.append(comm)
        issues.extend(found)
    ras_raw = data.get("ras")
    ras: dict[str, Any] = ras_raw if isinstance(ras_raw, dict) else {}
    timeouts = ras.get("timeouts_count")
    seconds = ras.get("collection_time_sec")
    version = data.get("nccl_version")
    return RasReport(
        "json",
        nccl_version=version if isinstance(version, str) else None,
        cuda_runtime=data.get("cuda_runtime_version") if isinstance(data.get("cuda_runtime_version"), int) else None,
        cuda_driver=data.get("cuda_driver_version") if isinstance(data.get("cuda_driver_version"), int) else None,
        communicators=tuple(comms),
        issues=tuple(issues),
        timeouts=timeouts if isinstance(timeouts, int) else 0,
        collection_s=float(seconds) if isinstance(seconds, int | float) else None,
    )


# ---------------------------------------------------------------------------------------------------- text

# "NCCL version 2.28.9 compiled with CUDA 13.0" (client_support.cc:542)
VERSION_RE = lazy_compile(r"^NCCL version (\S+) compiled with CUDA \S+$")
# "CUDA runtime version 13000, driver version 13000" (client_support.cc:544)
CUDA_RE = lazy_compile(r"^CUDA runtime version (-?\d+), driver version (-?\d+)$")
# "      2          8            1         16       16" under "(total)   per node  per process    (total)  (total)"
# (client_support.cc:603-606, the consistent case: nodes, processes per node, GPUs per process, processes, GPUs);
# the inconsistent case ends with "%7d  %9d  %11d" (nodes, processes, GPUs) under "(total)    (total)      (total)"
# (client_support.cc:725-729).
JOB_RE = lazy_compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)(?:\s+(\d+)\s+(\d+))?\s*$")
# "    0         1         2         8        16        16   RUNNING      OK" (client_support.cc:1213,
# "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s": group, comms, nodes, ranks per node ("8" or "1-2"), ranks per comm,
# ranks in group, status, errors)
GROUP_RE = lazy_compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)(?:-(\d+))?\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$")
# "Communicators... (0.014s)" (client_support.cc:778 then 1020; "%.2fs" before 2.28, 2.24.3-1 :880)
COMMS_TIME_RE = lazy_compile(r"^Communicators\.\.\. \((\d+(?:\.\d+)?)s\)$")
# "#0-0 (7f3a9e0c21d4b6a1) INCOMPLETE" (client_support.cc:1336, 1365, 1413: "#%d-%d (%016lx) KIND")
COMM_HEAD_RE = lazy_compile(r"^#(\d+-\d+) \(([0-9a-f]+)\) (INCOMPLETE|ERROR|MISMATCH)$")
# "  Process 12345 on node 10.0.0.2 managing GPU 3" / "managing GPUs 0,1 (NVML 2,3)" (client_support.cc:1280, 1313)
PROCESS_RE = lazy_compile(r"^  Process (\d+) on node (\S+) managing GPUs? ([\d,]*)(?: \(NVML ([\d,]*)\))?$")
# "  Rank 11 -- GPU 3 managed by process 12345 on node 10.0.0.2" (client_support.cc:1348), with the 2.26+ variants
# "  Rank 1 has status INIT -- GPU ..." (:1485), "  Rank 1 has launched up to operation 9 -- GPU ..." (:1595),
# "  Rank 1 has not launched any operations -- GPU ..." (:1601), "  Rank 1 reported Remote process error -- GPU ..."
# (:1682), and "  Rank 1 -- [process information not found]" (:1354)
RANK_RE = lazy_compile(
    r"^  Rank (\d+)(?: (has status \S+|has launched up to operation \d+|has not launched any operations|reported .+?))?"
    r" -- (?:GPU (\d+)(?: \(NVML (\d+)\))? managed by process (\d+) on node (\S+)|\[process information not found\])$"
)
# "  The missing ranks: 3,11" (2.24.3-1 client_support.cc:1172, before ranks were listed one per line)
MISSING_RANKS_RE = lazy_compile(r"^  The missing ranks?: ([\d,]+)$")
# "  Encountered 2 communication timeouts while gathering communicator data" (client_support.cc:1401)
TIMEOUT_RE = lazy_compile(r"^  Encountered (\d+) communication timeouts? while gathering communicator data$")

_SECTION_KIND: dict[str, IssueKind] = {"INCOMPLETE": "unresponsive", "DEAD": "dead"}


def _gpus(text: str | None) -> tuple[int, ...]:
    return tuple(int(g) for g in (text or "").split(",") if g.isascii() and g.isdigit())


class _TextState(Struct):
    section: str = ""  # "INCOMPLETE" / "DEAD" (job level) or "#0-0 (hash) KIND"
    comm: str = ""
    comm_kind: str = ""
    context: str = ""  # the line above a run of rank lines ("  2 ranks have status INIT")
    header: str = ""
    issues: list[RankIssue] = field(default_factory=list)


def _rank_kind(state: _TextState, what: str | None) -> IssueKind:
    words = what or state.context
    if state.comm_kind == "INCOMPLETE":
        return "unresponsive"
    if state.comm_kind == "ERROR" or "reported" in words:
        return "error"
    if "NOCOMM" in words:
        return "nocomm"
    if "status" in words:
        return "status"
    return "behind"


def _rank_line(state: _TextState, m: re.Match[str], line: str) -> None:
    rank, what, gpu, nvml, pid, host = m.groups()
    evidence = "\n".join(x for x in (state.header, state.context, line) if x)
    kind = _rank_kind(state, what)
    state.issues.append(
        RankIssue(kind, state.comm, int(rank), host, int(pid) if pid else None, _gpus(gpu), evidence, _gpus(nvml))
    )


def _process_line(state: _TextState, m: re.Match[str], line: str) -> None:
    pid, host, gpus, nvml = m.groups()
    kind = _SECTION_KIND.get(state.section)
    if kind is None:
        return
    evidence = "\n".join(x for x in (state.section, state.header, line) if x)
    state.issues.append(RankIssue(kind, "", None, host, int(pid), _gpus(gpus), evidence, _gpus(nvml)))


def _body_line(state: _TextState, line: str) -> None:
    """One line of the Errors / Warnings sections."""
    if line in ("INCOMPLETE", "DEAD", "TIMEOUT"):
        state.section, state.comm, state.comm_kind, state.context, state.header = line, "", "", "", ""
        return
    if m := COMM_HEAD_RE.match(line):
        state.section, state.comm, state.comm_kind = line, m.group(2), m.group(3)
        state.header, state.context = line, ""
        return
    if m := RANK_RE.match(line):
        _rank_line(state, m, line)
        return
    if m := PROCESS_RE.match(line):
        _process_line(state, m, line)
        return
    if m := MISSING_RANKS_RE.match(line):
        for rank in _gpus(m.group(1)):
            evidence = f"{state.header}\n{state.context}\n{line}".replace("\n\n", "\n")
            state.issues.append(RankIssue("unresponsive", state.comm, rank, None, None, (), evidence))
        return
    if line.startswith("  Communicator ranks have different"):
        state.header = f"{state.section}\n{line}"
        state.context = ""
        return
    if line.startswith("  ") and line.strip():
        if state.section in _SECTION_KIND and not state.header:
            state.header = line
        else:
            state.context = line


def _group(m: re.Match[str]) -> Communicator:
    g, count, nodes, lo, hi, size, _in_group, status, errors = m.groups()
    low = int(lo)
    return Communicator(f"group {g}", int(size), int(nodes), (low, int(hi) if hi else low), int(count), status, errors)


def parse_text_report(text: str) -> RasReport:
    """The text report (``ncclras``'s default output); RasReportError when it is not one."""
    lines = text.replace("\r\n", "\n").split("\n")
    fields: dict[str, Any] = {}
    comms: list[Communicator] = []
    state = _TextState()
    in_body = False
    previous = ""
    for line in lines:
        # a pasted fragment may start at a section heading, without the "Errors" line above it
        in_body = in_body or line in ("INCOMPLETE", "DEAD", "TIMEOUT") or bool(COMM_HEAD_RE.match(line))
        if m := VERSION_RE.match(line):
            fields["nccl_version"] = m.group(1)
        elif m := CUDA_RE.match(line):
            fields["cuda_runtime"], fields["cuda_driver"] = int(m.group(1)), int(m.group(2))
        elif m := COMMS_TIME_RE.match(line.strip()):
            fields["collection_s"] = float(m.group(1))
        elif line in ("Errors", "Warnings"):
            in_body = True
        elif in_body and (m := TIMEOUT_RE.match(line)):
            fields["timeouts"] = int(m.group(1))
        elif in_body:
            _body_line(state, line)
        elif m := GROUP_RE.match(line):
            comms.append(_group(m))
        elif previous.startswith("(total)") and (m := JOB_RE.match(line)):
            n = [int(x) for x in m.groups() if x is not None]
            fields["nodes"], fields["processes"], fields["gpus"] = (n[0], n[3], n[4]) if len(n) == 5 else n
        previous = line
    if "nccl_version" not in fields and not comms and not state.issues and "Communicators..." not in text:
        raise RasReportError("not an NCCL RAS report: no 'NCCL version' line, communicator table or rank line")
    return RasReport("text", communicators=tuple(comms), issues=tuple(state.issues), **fields)

"""`vllm-log`, `ray-log` and `text`: known failure signatures in a pasted or saved log, or in any text.

The same catalog and matcher as the live `logs` check (``sources.signatures``); one finding per signature code,
with the first offending line as evidence and the number of lines that matched. A paste is searched with every
signature whatever its kind (a vLLM log carries Ray's and NCCL's lines too); `text` takes what is neither a vLLM
nor a Ray log but shows a known failure (one traceback line, an NCCL WARN line) or a plain failure the catalog does
not know (judge/uncatalogued.py: ``UNCATALOGUED_ERROR``, a warning, never "ok" or unrecognised input).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import ClassVar

from dgxdoctor.diagnose.base import Diagnosis
from dgxdoctor.judge.cause import explained_away
from dgxdoctor.judge.frames import frame_findings
from dgxdoctor.judge.scan import Scanner, scan_text
from dgxdoctor.judge.signatures import Catalog, Match, Signature, load_catalog
from dgxdoctor.judge.uncatalogued import shows_plain_failure, uncatalogued_findings
from dgxdoctor.relaxed_re import may_search
from dgxdoctor.result import Finding
from dgxdoctor.sources.kernel_events import parse_kernel_event

# INFO 07-25 06:50:45 config.py:718] Defaulting to use ray for distributed inference      (vllm-project/vllm#6775)
# INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds                   (xming521/WeClone#83)
# (RayWorkerWrapper pid=11613, ip=11.46.89.2) ERROR 12-07 20:30:45 worker_base.py:480]    (vllm-project/vllm#10886)
VLLM_LINE = re.compile(
    r"^(?:\S.*?\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.]+\.py:\d+\]",
    re.MULTILINE,
)
# 2024-07-25 06:50:45,878	INFO worker.py:1603 -- Connecting to existing Ray cluster at address: 192.168.201.210:6379
#   (vllm-project/vllm#6775; Ray's Python logging format "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- ")
RAY_PY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?:DEBUG|INFO|WARNING|ERROR) [\w.]+:\d+ -- ", re.M)
# (raylet) A worker died or was killed while executing a task ...   (verl-project/verl#2398)
# (autoscaler +41s) Error: No available node types can fulfill ...  (vllm-project/vllm#14111)
# ray.exceptions.RayActorError: The actor died unexpectedly ...    (sjtu-marl/malib#33)
# [2026-11-30 02:06:41,232 W 22797 22797] (gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, ...
#   (Ray 2.60.0 gcs_server.out; the driver prints "(raylet)" wrapped in ANSI colour codes)
RAY_MARKER = re.compile(r"\((?:raylet|autoscaler|gcs_server)[^)]*\)|ray\.exceptions\.|/tmp/ray/session_")
# gpu5:35917:35994 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>     (NCCL_DEBUG=INFO: host:pid:tid [cuda device])
# NCCL version 2.4.7+cuda9.2                                              (NVIDIA/nccl#226)
# (RayWorkerWrapper pid=581, ip=10.225.128.18) k8s17:581:581 [0] NCCL INFO P2P Chunksize set to 131072   (ray#59778)
NCCL_LINE = re.compile(r"^(?:\([^()\n]{1,200}\) ?){0,3}\S+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)\b|^NCCL version \d", re.M)
# PyTorch's ProcessGroupNCCL, as c10/glog print its records (the banner of options and environments it logs at start):
# [I ProcessGroupNCCL.cpp:850] [Rank 0] NCCL watchdog thread started!                          (PyTorch 2.0)
# [rank0]:[I1205 08:00:01.123456 ProcessGroupNCCL.cpp:905] [PG ID 1 PG GUID 1 Rank 0] ProcessGroupNCCL initialization
# I1205 08:00:01.123456 4030959 ProcessGroupNCCL.cpp:1669] [PG ID 0 PG GUID 0 Rank 0] HeartbeatMonitor environments: ...
PG_NCCL_LINE = re.compile(
    r"^(?:\([^()\n]{1,200}\) ?){0,3}(?:\[rank\d{1,6}\]:)?\[?[IWEF](?:\d{4} \d\d:\d\d:\d\d\.\d{1,9}(?: \d{1,10})?)? "
    r"ProcessGroupNCCL\.cpp:\d{1,6}\]",
    re.M,
)


# Lines kept per code for the rules that read them all (judge.cause); a huge log keeps the first ones.
KEPT_LINES = 1000


class Tally:
    """The first match of each signature code, the lines per code and the matched line numbers, however many
    lines are read (lines and numbers kept up to ``KEPT_LINES`` per code)."""

    def __init__(self) -> None:
        self.first: dict[str, Match] = {}
        self.counts: dict[str, int] = {}
        self.lines: dict[str, list[str]] = {}
        self.numbers: set[int] = set()

    def add(self, matches: Iterable[Match]) -> None:
        for match in matches:
            self.counts[match.code] = self.counts.get(match.code, 0) + 1
            self.first.setdefault(match.code, match)
            kept = self.lines.setdefault(match.code, [])
            if len(kept) < KEPT_LINES:
                kept.append(match.line)
                self.numbers.add(match.number)

    def findings(self, lines: list[str], signatures: Mapping[str, Signature]) -> list[Finding]:
        """One finding per signature code, the first line that showed it as evidence; then the tracebacks'
        frames where no catalog line follows (judge.frames), and the plain failures the catalog does not know
        (judge.uncatalogued), read in ``lines`` (the text, or its head)."""
        for code in explained_away(self.lines):
            del self.first[code], self.counts[code], self.lines[code]
        out = []
        for code, match in sorted(self.first.items(), key=lambda kv: kv[1].number):
            out.append(match.signature.finding(f"line {match.number}", match.line.strip()[:500], self.counts[code]))
        matched = {n - 1 for n in self.numbers}
        frames = frame_findings(lines, matched, signatures)
        unknown = uncatalogued_findings(lines, matched, _Known(signatures))
        return out + [f for f in frames if f.code not in self.first] + unknown


class _Known:
    """Whether a line is the catalog's or the kernel readers' (an XID, a kernel fault of the kernel-log kind): the
    catalog searched through its prefilter, the shipped one when these are its signatures (not one built anew, ~30
    ms of a diagnose), on the first line asked about."""

    def __init__(self, signatures: Mapping[str, Signature]) -> None:
        self._signatures = signatures
        self._catalog: Catalog | None = None

    def __call__(self, line: str) -> bool:
        if "Xid" in line or parse_kernel_event(line) is not None:
            return True
        if self._catalog is None:
            shipped = load_catalog()  # its search structures are built already (the scanner read the text with it)
            same = shipped.signatures == tuple(self._signatures.values())
            self._catalog = shipped if same else Catalog(self._signatures.values())
        return bool(self._catalog.find(line))


def _findings(text: str, catalog: Catalog) -> tuple[list[Finding], dict[str, int], int]:
    scanner = Scanner(catalog)
    tally = Tally()
    tally.add(scanner.feed(text))
    tally.add(scanner.flush())
    return tally.findings(text.splitlines(), catalog.by_code()), tally.counts, scanner.lines_read


class _LogAnalyzer:
    kind: ClassVar[str]

    def __init__(self, catalog: Catalog | None = None) -> None:
        self._catalog = catalog

    @property
    def catalog(self) -> Catalog:
        return self._catalog or load_catalog()

    def analyze(self, text: str) -> Diagnosis:
        findings, counts, n_lines = _findings(text, self.catalog)
        return Diagnosis(self.kind, tuple(findings), {"lines": n_lines, "matches": counts})


class VllmLogAnalyzer(_LogAnalyzer):
    kind: ClassVar[str] = "vllm-log"

    def detect(self, text: str) -> bool:
        return may_search(VLLM_LINE, text) and VLLM_LINE.search(text) is not None


class RayLogAnalyzer(_LogAnalyzer):
    kind: ClassVar[str] = "ray-log"

    def detect(self, text: str) -> bool:
        return any(may_search(p, text) and p.search(text) is not None for p in (RAY_PY_LINE, RAY_MARKER))


class NcclLogAnalyzer(_LogAnalyzer):
    """NCCL's own log (NCCL_DEBUG=INFO lines), or PyTorch's ProcessGroupNCCL records (its banner of options at
    start), outside a vLLM or Ray log: a healthy one is recognised and "ok", not unknown input."""

    kind: ClassVar[str] = "nccl-log"

    def detect(self, text: str) -> bool:
        if may_search(NCCL_LINE, text) and NCCL_LINE.search(text) is not None:
            return True
        return "ProcessGroupNCCL.cpp:" in text and PG_NCCL_LINE.search(text) is not None


class TextAnalyzer(_LogAnalyzer):
    """Any text that shows a known failure signature, or a plain failure the catalog does not know (the catch-all
    after every other kind)."""

    kind: ClassVar[str] = "text"

    def detect(self, text: str) -> bool:
        lines = text.splitlines()
        return (
            bool(scan_text(self.catalog, text))
            or bool(frame_findings(lines, (), self.catalog.by_code()))
            or shows_plain_failure(text)
        )

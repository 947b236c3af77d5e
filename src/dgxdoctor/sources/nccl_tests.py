"""Parse what nccl-tests (all_reduce_perf, all_gather_perf, ...) printed, in every layout it has used.

The column header names the layout, so rows are read by the header's column names, not by position:

- NCCL 1 era (NVIDIA/nccl#120): ``#  bytes  N  type  op  time  algbw  busbw  res  ...`` with time in ms and a max
  error ("res") instead of a count;
- 2.x before redop (NVIDIA/nccl-tests#82, broadcast): ``size count type root time algbw busbw error ...``;
- 2.x with redop (NVIDIA/nccl-tests#107, NVIDIA/nccl#583): ``size count type redop time algbw busbw error ...``;
- 2.13+ (NVIDIA/nccl-tests#232, #252): ``size count type redop root time algbw busbw #wrong ...``, with a units
  line ``(B) (elements) (us) (GB/s) (GB/s)`` and values ``N/A`` where a check was skipped;
- 2.18+ adds ``# nccl-tests version 2.18.0 nccl-headers=... nccl-library=...`` and ``# Collective test starting:``.

Output of ``mpirun`` may prefix every line with ``[1,0]<stdout>:``; NCCL_DEBUG=INFO lines are mixed in and tell
the transport (``NET/IB`` or the TCP fallback ``NET/Socket``): they are read by ``sources.nccl_info``, the one
parser of NCCL's INFO lines. Without a header (a pasted fragment) a row is read
from its end: the last eight values are time, algbw, busbw, error for out-of-place then in-place.
"""

from __future__ import annotations

import math
from typing import Any

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.records import asdict
from dgxdoctor.sources.nccl_info import VERSION, NcclTransport, parse_nccl_info, strip_prefix

# # Avg bus bandwidth    : 95.3009
#   (NVIDIA/nccl-tests#252; printed as "# %-20s : %g" by src/common.cu writeResultFooter)
AVG_BUSBW = lazy_compile(r"Avg bus bandwidth\s*:\s*(\S+)")
# # Out of bounds values : 0 OK
#   (NVIDIA/nccl-tests#252)
OUT_OF_BOUNDS = lazy_compile(r"Out of bounds values\s*:\s*(\d{1,18})\b")
# # nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 ...
#   (NVIDIA/nccl-tests#293)
NGPUS = lazy_compile(r"nThread\s+(\d{1,9})\s+nGpus\s+(\d{1,9})\b")
# # nccl-tests version 2.18.0 nccl-headers=22907 nccl-library=22907
#   (nccl-tests 2.18 header, as pasted in public benchmark notes)
TESTS_VERSION = lazy_compile(r"nccl-tests version (\S+)")
# # Collective test starting: all_gather_perf_mpi
#   (nccl-tests 2.18 header)
COLLECTIVE = lazy_compile(r"Collective test starting:\s*(\S+)")
# #  Rank  0 Group  0 Pid   3595 on      test1 device  0 [0x81] NVIDIA A100-PCIE-40GB
#   (NVIDIA/nccl-tests#293; 2.x before groups: "#   Rank  0 Pid   1320 on ip-172-31-20-228 device  0 ...", #107)
RANK_HOST = lazy_compile(r"Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
MIB = 1024 * 1024

_ALIASES = {"bytes": "size", "n": "count", "op": "redop", "#wrong": "wrong", "error": "wrong", "res": "wrong"}


class Measurement(Struct, frozen=True):
    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    # #wrong count (2.13+), error count (2.x) or max error (NCCL 1 "res"); None for N/A.
    wrong: float | None


class Row(Struct, frozen=True):
    size_bytes: int
    count: int | None
    type: str | None
    redop: str | None
    root: int | None
    out_of_place: Measurement
    in_place: Measurement

    @property
    def busbw_gbps(self) -> float | None:
        values = [v for v in (self.out_of_place.busbw_gbps, self.in_place.busbw_gbps) if v is not None]
        return max(values) if values else None


class NcclTestsReport(Struct, frozen=True):
    rows: tuple[Row, ...]
    avg_busbw_gbps: float | None
    out_of_bounds: int | None = None
    # nThread x nGpus of one process (the "# nThread 1 nGpus 8" header line).
    gpus_per_process: int | None = None
    ranks: int = 0
    tests_version: str | None = None
    nccl_version: str | None = None
    collective: str | None = None
    hosts: tuple[str, ...] = ()
    # What NCCL's INFO lines among the table said about its transport (sources.nccl_info).
    transport: NcclTransport = field(default_factory=NcclTransport)

    @property
    def transports(self) -> dict[str, str]:
        """Network transports NCCL reported ("IB", "Socket"), first seen first, with the first line for each."""
        t = self.transport
        kinds = [k.removeprefix("NET/") for k in t.net_channels] + list(t.net_devices)
        if t.network:
            kinds.append(t.network)
        found: dict[str, str] = {}
        for kind in kinds:
            line = t.lines.get(f"NET/{kind}") or t.lines.get("network") or ""
            found.setdefault(kind, line)
        return found

    @property
    def peak_busbw_gbps(self) -> float | None:
        values = [r.busbw_gbps for r in self.rows if r.busbw_gbps is not None]
        return max(values) if values else None

    def to_data(self) -> dict[str, Any]:
        return {
            "avg_busbw_gbps": self.avg_busbw_gbps,
            "peak_busbw_gbps": self.peak_busbw_gbps,
            "rows": [asdict(r) for r in self.rows],
            "out_of_bounds": self.out_of_bounds,
            "gpus_per_process": self.gpus_per_process,
            "ranks": self.ranks,
            "tests_version": self.tests_version,
            "nccl_version": self.nccl_version,
            "collective": self.collective,
            "hosts": list(self.hosts),
            "transports": sorted(self.transports),
        }


def looks_like_nccl_tests(text: str) -> bool:
    return "Avg bus bandwidth" in text or ("algbw" in text and "busbw" in text)


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None  # "N/A", "nan" printed as text, garbage
    return value if math.isfinite(value) else None


def _int(token: str | None) -> int | None:
    if token is None:
        return None
    try:
        return int(token)
    except ValueError:
        return None


def _header(line: str) -> list[str] | None:
    body = line.lstrip().lstrip("#").strip()
    tokens = body.split()
    if "algbw" not in tokens or "busbw" not in tokens or "time" not in tokens:
        return None
    return [_ALIASES.get(t.lower(), t.lower()) for t in tokens]


def _measure(values: list[str | None], time_scale: float) -> Measurement:
    t, a, b, w = (None if v is None else _number(v) for v in values)
    return Measurement(None if t is None else t * time_scale, a, b, w)


def _row_by_header(tokens: list[str], header: list[str], time_scale: float) -> Row | None:
    if len(tokens) != len(header):
        return None
    named: dict[str, list[str]] = {}
    for name, token in zip(header, tokens, strict=True):
        named.setdefault(name, []).append(token)

    def nth(name: str, i: int) -> str | None:
        got = named.get(name, [])
        return got[i] if len(got) > i else None

    size = _int(nth("size", 0))
    if size is None:
        return None
    return Row(
        size_bytes=size,
        count=_int(nth("count", 0)),
        type=nth("type", 0),
        redop=nth("redop", 0),
        root=_int(nth("root", 0)),
        out_of_place=_measure([nth(k, 0) for k in ("time", "algbw", "busbw", "wrong")], time_scale),
        in_place=_measure([nth(k, 1) for k in ("time", "algbw", "busbw", "wrong")], time_scale),
    )


def _row_from_end(tokens: list[str], time_scale: float) -> Row | None:
    if len(tokens) < 10:
        return None
    size = _int(tokens[0])
    if size is None:
        return None
    tail = tokens[-8:]
    middle = tokens[2:-8]
    return Row(
        size_bytes=size,
        count=_int(tokens[1]),
        type=middle[0] if middle else None,
        redop=middle[1] if len(middle) > 1 and not middle[1].lstrip("-").isdigit() else None,
        root=_int(middle[-1]) if len(middle) > 1 and middle[-1].lstrip("-").isdigit() else None,
        out_of_place=_measure(list(tail[:4]), time_scale),
        in_place=_measure(list(tail[4:]), time_scale),
    )


class _Scan(Struct):
    """What parse_nccl_tests has gathered so far, line by line."""

    header: list[str] | None = None
    time_scale: float = 1.0  # to microseconds
    rows: list[Row] = field(default_factory=list)
    avg: float | None = None
    oob: int | None = None
    gpus_per_process: int | None = None
    tests_version: str | None = None
    nccl_version: str | None = None
    collective: str | None = None
    ranks: int = 0
    hosts: dict[str, None] = field(default_factory=dict)
    nccl_lines: list[str] = field(default_factory=list)

    def nccl_log(self, line: str) -> None:
        self.nccl_lines.append(line)
        if (m := VERSION.search(line)) and self.nccl_version is None:
            self.nccl_version = m["version"] + m["build"]

    def table_line(self, line: str) -> bool:
        """The summary lines, the header and the units line; True when the line was one of them."""
        if (m := AVG_BUSBW.search(line)) is not None:
            self.avg = _number(m.group(1))
            return True
        if (m := OUT_OF_BOUNDS.search(line)) is not None:
            self.oob = int(m.group(1))
            return True
        if line.lstrip().startswith("#") or self.header is None:
            found = _header(line)
            if found is not None:
                self.header = found
                # NCCL 1 printed milliseconds and named the columns bytes/N/op/res.
                self.time_scale = 1000.0 if "bytes" in line.split() else 1.0
                return True
        if "(us)" in line or "(ms)" in line:
            self.time_scale = 1000.0 if "(ms)" in line else 1.0
            return True
        return False

    def preamble_line(self, line: str) -> bool:
        """The lines before the table: GPUs, versions, the collective, one line per rank."""
        if (m := NGPUS.search(line)) is not None:
            self.gpus_per_process = self.gpus_per_process or int(m.group(1)) * int(m.group(2))
        elif (m := TESTS_VERSION.search(line)) is not None:
            self.tests_version = m.group(1)
        elif (m := COLLECTIVE.search(line)) is not None:
            self.collective = m.group(1)
        elif (m := RANK_HOST.search(line)) is not None:
            self.hosts.setdefault(m.group(1), None)
            self.ranks += 1
        elif (m := VERSION.search(line)) is not None:
            self.nccl_version = self.nccl_version or m["version"] + m["build"]
        else:
            return False
        return True

    def row(self, line: str) -> None:
        tokens = line.split()
        row = _row_by_header(tokens, self.header, self.time_scale) if self.header else None
        if row is None and tokens and tokens[0].isdigit():
            row = _row_from_end(tokens, self.time_scale)
        if row is not None:
            self.rows.append(row)


def parse_nccl_tests(text: str) -> NcclTestsReport:
    """Rows and summary of nccl-tests output; raises ValueError when the text has no result rows at all."""
    scan = _Scan()
    for raw in text.splitlines():
        line = strip_prefix(raw)
        if not line.strip():
            continue
        if "NCCL INFO" in line or "NCCL WARN" in line:
            scan.nccl_log(line)
        elif not scan.table_line(line) and not scan.preamble_line(line) and not line.lstrip().startswith("#"):
            scan.row(line)
    if not scan.rows and scan.avg is None:
        raise ValueError("no nccl-tests result rows and no 'Avg bus bandwidth' line found")
    return NcclTestsReport(
        rows=tuple(scan.rows),
        avg_busbw_gbps=scan.avg,
        out_of_bounds=scan.oob,
        gpus_per_process=scan.gpus_per_process,
        ranks=scan.ranks,
        tests_version=scan.tests_version,
        nccl_version=scan.nccl_version,
        collective=scan.collective,
        hosts=tuple(scan.hosts),
        transport=parse_nccl_info("\n".join(scan.nccl_lines)),
    )

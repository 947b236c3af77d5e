"""`nvidia-smi topo -m`: parse the GPU/NIC connection matrix (the verdicts are in ``judge/topology.py``).

One parser for every place the format is read (the live ``topology`` check and ``dgxdoctor diagnose``).
The format is not documented as a machine interface; the legend it prints is the reference
(``nvidia-smi topo -h`` and the "Legend:" block). Eras seen (tests/fixtures/topo/SOURCES.md):

- columns of GPUs, then NICs named ``NIC0..NICn`` with a trailing ``NIC Legend:`` block mapping
  ``NIC0: mlx5_0`` (drivers of 2022 on), or NICs named by their RDMA device (``mlx5_0``) in older drivers;
- affinity columns ``CPU Affinity``, ``NUMA Affinity`` and (drivers 535+) ``GPU NUMA ID``;
- cells separated by tabs, with an empty cell before ``GPU NUMA ID``; pasted copies often have spaces instead;
- the header underlined with ANSI escapes even when stdout is not a terminal (driver 580).
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile

# Driver 580 prints the header as "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\t...\x1b[0m" (ECMA-48 SGR sequences).
ANSI_ESCAPE_RE = lazy_compile(r"\x1b\[[0-9;]*[A-Za-z]")

# "GPU0\t X \tNV18\t0-31\t0\t\tN/A": the first token of a GPU row or column.
GPU_NAME_RE = lazy_compile(r"^GPU(\d+)$")

# "NV18" = "Connection traversing a bonded set of # NVLinks" (the legend's "NV#").
NVLINK_RE = lazy_compile(r"^NV(\d{1,4})$")

# Any cell of the device part of the matrix: "X" (self), "NV12", "SYS", "NODE", "PHB", "PXB", "PIX",
# "SOC" (the name of SYS before driver 384), "N/A". Unknown upper-case codes are kept, not rejected:
# a newer driver may add one, and it is still "not NVLink".
LINK_CELL_RE = lazy_compile(r"^(X|NV\d{1,4}|[A-Z][A-Z0-9/]{1,7})$")

# "  NIC0: mlx5_0" in the "NIC Legend:" block.
NIC_LEGEND_RE = lazy_compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")

# Affinity headers as printed, matched in a space-separated header ("CPU Affinity    NUMA Affinity   GPU NUMA ID").
AFFINITY_HEADER_RE = lazy_compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")

# PCIe levels, nearest first, as the legend defines them.
PCIE_NEAR = ("PIX", "PXB")
# Every non-NVLink cell the legend defines, plus "SOC" (old name of SYS) and "N/A".
KNOWN_LEVELS = frozenset({"X", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "N/A"})


class TopoParseError(ValueError):
    """The text is not an ``nvidia-smi topo -m`` matrix, or a line of it is malformed."""


class TopoMatrix(Struct, frozen=True):
    gpus: tuple[str, ...]
    # Non-GPU columns: "NIC0".. or, in older outputs, the RDMA device names themselves ("mlx5_0").
    nics: tuple[str, ...]
    # row -> column -> cell, the diagonal ("X") left out. Rows a truncated paste lacks are absent.
    matrix: dict[str, dict[str, str]]
    nic_legend: dict[str, str] = field(default_factory=dict)
    # row -> {"CPU Affinity": "0-31", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)
    # row -> the line as printed (ANSI removed), for evidence
    lines: dict[str, str] = field(default_factory=dict)

    def nic_device(self, nic: str) -> str:
        """RDMA device name of a NIC column ("NIC0" -> "mlx5_0"; "mlx5_0" stays)."""
        return self.nic_legend.get(nic, nic)

    def link(self, a: str, b: str) -> str | None:
        cell = self.matrix.get(a, {}).get(b)
        if cell is None:
            cell = self.matrix.get(b, {}).get(a)
        return cell

    def to_data(self) -> dict[str, Any]:
        return {
            "gpus": list(self.gpus),
            "nics": list(self.nics),
            "matrix": {row: dict(cells) for row, cells in self.matrix.items()},
            "nic_legend": dict(self.nic_legend),
            "affinity": {row: dict(a) for row, a in self.affinity.items()},
        }


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE_RE.sub("", text)


def _is_header(tokens: list[str]) -> bool:
    """ "GPU0 GPU1 ..." / "GPU0 CPU Affinity ..." (one GPU) / "GPU0 NIC0 ..." / "GPU0 mlx5_0 ...": the second
    token is another column name, not a cell; a row's second token is a cell ("X", "NV18", "SYS")."""
    if len(tokens) < 2 or not GPU_NAME_RE.match(tokens[0]):
        return False
    return tokens[1] not in KNOWN_LEVELS and not NVLINK_RE.match(tokens[1])


def _split_header(line: str) -> tuple[list[str], list[str]]:
    """Columns of the device part and of the affinity part."""
    if "\t" in line:
        cells = [c.strip() for c in line.split("\t") if c.strip()]
    else:
        head, sep, tail = line.partition(" CPU ")
        cells = head.split()
        if sep:
            cells += AFFINITY_HEADER_RE.findall("CPU " + tail)
    devices: list[str] = []
    rest: list[str] = []
    for cell in cells:
        if rest or " " in cell or cell in ("CPU", "NUMA"):
            rest.append(cell)
        else:
            devices.append(cell)
    return devices, rest


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` output (any era above). Raises TopoParseError naming the bad line."""
    lines = strip_ansi(text).splitlines()
    header_at = next((i for i, ln in enumerate(lines) if _is_header(ln.split())), None)
    if header_at is None:
        raise TopoParseError("no 'nvidia-smi topo -m' header (a line of columns starting with GPU0) found")
    columns, affinity_columns = _split_header(lines[header_at])
    if len(set(columns)) != len(columns):
        raise TopoParseError(f"duplicate column names in header: {lines[header_at].strip()!r}")
    gpus = tuple(c for c in columns if GPU_NAME_RE.match(c))
    nics = tuple(c for c in columns if not GPU_NAME_RE.match(c))

    matrix: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    row_lines: dict[str, str] = {}
    legend: dict[str, str] = {}
    in_rows = True
    in_nic_legend = False
    for number, raw in enumerate(lines[header_at + 1 :], start=header_at + 2):
        stripped = raw.strip()
        if in_rows:
            if not stripped:
                in_rows = False
                continue
            if stripped.startswith("Legend"):
                in_rows = False
            else:
                name, cells, extra = _split_row(raw, len(columns))
                if name in matrix:
                    raise TopoParseError(f"line {number}: row {name!r} appears twice")
                matrix[name] = _matrix_row(number, name, cells, columns, stripped)
                row_lines[name] = stripped
                if extra:
                    affinity[name] = dict(zip(affinity_columns, extra, strict=False))
                continue
        if stripped.startswith("NIC Legend"):
            in_nic_legend = True
            continue
        if in_nic_legend and stripped:
            match = NIC_LEGEND_RE.match(raw)
            if match is None:
                in_nic_legend = False
            else:
                legend[match.group(1)] = match.group(2)
    if not any(g in matrix for g in gpus):
        raise TopoParseError("header found but no GPU rows follow it")
    return TopoMatrix(gpus, nics, matrix, legend, affinity, row_lines)


def _matrix_row(number: int, name: str, cells: list[str], columns: list[str], line: str) -> dict[str, str]:
    """One row's link cells by column (the diagonal X left out); TopoParseError naming the bad cell."""
    if name not in columns:
        raise TopoParseError(f"line {number}: row {name!r} is not one of the columns: {line!r}")
    if len(cells) < len(columns):
        raise TopoParseError(f"line {number}: row {name} has {len(cells)} cells, the header has {len(columns)} columns")
    row: dict[str, str] = {}
    for column, cell in zip(columns, cells, strict=True):
        if not LINK_CELL_RE.match(cell):
            raise TopoParseError(f"line {number}: cell {name}/{column} is {cell!r}, not a link type")
        if column == name:
            if cell != "X":
                raise TopoParseError(f"line {number}: diagonal cell of {name} is {cell!r}, not X")
            continue
        row[column] = cell
    return row


def _split_row(raw: str, n_columns: int) -> tuple[str, list[str], list[str]]:
    """Name, device cells, non-empty affinity cells. Tabs when present (cells may be empty there);
    otherwise whitespace, which is safe because no device cell is empty and no affinity value has spaces."""
    if "\t" in raw:
        parts = [p.strip() for p in raw.split("\t")]
        while parts and not parts[0]:
            parts.pop(0)
    else:
        parts = raw.split()
    name = parts[0] if parts else ""
    cells = parts[1 : 1 + n_columns]
    extra = [p for p in parts[1 + n_columns :] if p]
    return name, cells, extra


def nvlinks(cell: str | None) -> int | None:
    match = NVLINK_RE.match(cell or "")
    return int(match.group(1)) if match else None


def gpu_link_summary(topo: TopoMatrix) -> str:
    """Distinct GPU-GPU link types, e.g. "NV18" or "NV3,SYS"; "" with fewer than two GPUs."""
    gpus = [g for g in topo.gpus if g in topo.matrix]
    cells = {topo.link(a, b) or "?" for i, a in enumerate(gpus) for b in gpus[i + 1 :]}
    return ",".join(sorted(cells))

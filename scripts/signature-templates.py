#!/usr/bin/env python3
"""Regenerate src/dgxdoctor/data/signature_templates.json: every message template each failure class can print,
found in the sources that print it, with its origin ``repo@tag:path:line``.

The catalog (data/signatures.toml) is written by hand from real pasted lines; this table checks it against the
sources. For each signature, NEEDLES below lists literal text its messages contain; the script finds every string
in the given sources that holds a needle and writes the whole message as a template (placeholders as ``{}``) with
where it was printed. tests/unit/test_signature_templates.py then fills every template with sample values and
asserts ``dgxdoctor diagnose`` names it. A new release is a re-run: the templates it moved, reworded or added show
in the table's diff, and the test fails where the catalog no longer knows a wording.

Sources, each ``REPO@TAG=PATH`` (any number of each):
  --git   a git directory (a mirror: ``git grep`` at TAG, no work tree needed), e.g. NVIDIA/nccl
  --wheel a released wheel (.whl: read as a zip, Python sources by their AST, binaries by their strings)
  --tree  an installed package directory (site-packages/<pkg>), read like a wheel

    python3 scripts/signature-templates.py --out src/dgxdoctor/data/signature_templates.json \\
        --git NVIDIA/nccl@v2.18.3-1=/work/.mirror/NVIDIA+nccl/repo \\
        --wheel vllm-project/vllm@v0.6.3.post1=/tmp/wheels/vllm-0.6.3.post1-cp38-abi3-manylinux1_x86_64.whl ...

scripts/signature-templates.sources lists the sources the committed table was built from (the same arguments,
one a line, with $MIRRORS, $WHEELS, $VLLM_SITE, $RAY_SITE); ``--sources FILE`` reads such a file. Standard library
only; the sources' arguments, git reads and the write are scripts/template_sources.py's, shared with
scripts/kernel-templates.py.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from template_sources import git, git_show, parse_command_line, split_spec, write_table

FORM = "REPO@TAG=PATH"
KINDS = ("git", "wheel", "tree")

# Literal text per signature code; a needle must sit inside one string literal of the source. ``samples`` fill the
# template's placeholders in order where the default ("8") would not read as the real message does.
NEEDLES: dict[str, list[str]] = {
    "NCCL_NET_FAILURE": ["NET/IB : No device found", "Failed to open libibverbs"],
    "NCCL_NETWORK_ERROR": [
        "Got completion from peer",
        "Got completion with error",
        "Got async error event",
        "Connection closed by remote peer",
        "remote process exited or there was a network error",
    ],
    "NCCL_SYSTEM_ERROR": ["unhandled system error"],
    "CUDA_UNHANDLED_ERROR": ["unhandled cuda error", "Cuda failure"],
    "NCCL_TIMEOUT": [
        "Watchdog caught collective operation timeout",
        "Some NCCL operations have failed or timed out",
        "Heartbeat monitor timed out",
        "watchdog got stuck for",
    ],
    "SHM_TOO_SMALL": ["shared memory segment", "failed to extend"],
    "NCCL_DUPLICATE_GPU": ["Duplicate GPU detected"],
    "CUDA_DRIVER_INIT": [
        "Failed to find CUDA library",
        "Unexpected error from cudaGetDeviceCount",
        "CUDA driver initialization failed",
        "The NVIDIA driver on your system is too old",
    ],
    "TP_HEADS_NOT_DIVISIBLE": ["must be divisible by tensor parallel size", "{} is not divisible by {}"],
    "KV_CACHE_NO_MEMORY": ["No available memory for the cache blocks"],
    "MAX_MODEL_LEN_TOO_LARGE": [
        "is larger than the maximum number of tokens that can be stored in KV cache",
        "To serve at least one request with the models",
        "KV cache is needed, which is larger than the available KV cache memory",
    ],
    "RAY_GPUS_PENDING": [
        "Waiting for creating a placement group of specs",
        "exceeds available GPUs ({})",
        "The number of required GPUs exceeds the total number of available GPUs",
        "No available node types can fulfill resource request",
    ],
    "NO_GPU_VISIBLE": [
        "Current node has no GPU available",
        "does not allocate any GPUs on the driver node",
        "Failed to infer device type",
        "No CUDA GPUs are available",
    ],
    "VLLM_ENGINE_DEAD": [
        "EngineCore encountered an issue",
        "Engine core proc",
        "died unexpectedly, shutting down executor",
        "EngineCore encountered a fatal error",
        "EngineCore hit an exception",
        "AsyncLLM output_handler failed",
        "Background loop has errored already",
        "Background loop is not running",
        "is already dead, terminating server process",
        "Engine core initialization failed",
    ],
    "CUDA_OOM": ["CUDA out of memory. Tried to allocate"],
    "CUDA_OOM_STARTUP": ["on startup is less than desired", "CUDA out of memory occurred when warming up"],
    "MODEL_PATH_MISSING": [
        "Invalid repository ID or local directory specified",
        "Cannot find any model weights with",
        "Incorrect path_or_model_id",
        "does not appear to have a file named config.json",
        "Can't load the configuration of",
    ],
    "RAY_VERSION_MISMATCH": ["Version mismatch: The cluster was started with"],
    "RAY_HOST_OOM": [
        "killed due to memory pressure (OOM)",
        "Task was killed due to the node running low on memory",
        "which exceeds the memory usage threshold of",
        "System memory low at node with IP",
    ],
    "RAY_WORKER_DIED": [
        "The actor died unexpectedly before finishing this task",
        "The actor is dead because its worker process has died",
        "A worker died or was killed while executing a task",
    ],
    "RAY_NODE_LOST": [
        "marked dead because the detector has missed too many heartbeats",
        "mistakenly been marked",
        "beem marked as dead",
        "Raylet is terminated",
    ],
    "RAY_GCS_UNREACHABLE": [
        "Failed to connect to GCS",
        "Unable to connect to GCS at",
        "Timed out while waiting for GCS to become available",
    ],
    "TORCH_RENDEZVOUS_TIMEOUT": [
        "The client socket has timed out after",
        "TCP client failed to connect/validate to host",
        "The connection to the C10d store has failed",
        "waiting for clients",
    ],
    "GLOO_SOCKET": ["connectFullMesh failed"],
}
# Placeholder values where "8" would not read as the real message (keyed by a needle).
SAMPLES: dict[str, list[str]] = {
    "shared memory segment": ["creating", "/dev/shm/nccl-fjwOOB", "5967872", "No space left on device", "28"],
    "failed to extend": ["/dev/shm/nccl-fjwOOB", "5967876", "No space left on device", "28"],
    "The client socket has timed out after": ["600000ms", "(172.18.21.4, 37907)"],
    "Failed to find CUDA library": ["libcuda.so", "", "libcuda.so: cannot open shared object file"],
    "Incorrect path_or_model_id": ["/models/glm"],
    "Got async error event": ["mlx5_0", "1", "port error"],
}
PY_SUFFIXES = (".py",)
LOG_CALLS = frozenset({"error", "warning", "exception", "critical", "info", "debug"})
C_SUFFIXES = (".cc", ".cpp", ".c", ".h", ".hpp", ".cu")
# Binaries whose strings are read (a wheel's compiled sources are not in it): Ray's raylet and GCS, torch's libs.
BINARIES = re.compile(r"(?:^|/)(?:raylet|gcs_server|_raylet\.so|libtorch_cpu\.so|libtorch_cuda\.so|libc10_cuda\.so)$")
PRINTF = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|z|j|t|L|PRI\w+)?[diouxXeEfgGcspn]")
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
# NCCL's WARN("...") / INFO(NCCL_INIT, "...") and Ray's RAY_LOG(ERROR) << "..." statements.
NCCL_MACRO = re.compile(r"\b(WARN|INFO|TRACE)\s*\(")
FORMAT_RUN = re.compile(r'"(?:[^"\\\n]|\\.)*"(?:\s*"(?:[^"\\\n]|\\.)*")*')
# Matches that are no failure line: (code, how printed, template regex, why).
SKIP = [
    ("", "nccl-trace", r"", "TRACE exists only in NCCL debug builds"),
    ("CUDA_UNHANDLED_ERROR", "nccl-info", r"Cuda failure", "CUDACHECKIGNORE: a CUDA error NCCL ignores, at INFO"),
    ("NCCL_NETWORK_ERROR", "nccl-info", r"Got completion with error \(devIndex", "NCCL 2.30 resiliency: retried, INFO"),
    ("SHM_TOO_SMALL", "text", r"^Couldn't allocate shared memory segment", "torch's libshm (DataLoader tensors)"),
]


@dataclass
class Template:
    code: str
    text: str
    printed: str  # how the line reaches a log: raise:<Exception>, log, nccl-warn, nccl-info, text
    origins: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)


def needles_in(text: str) -> list[tuple[str, str]]:
    return [(code, n) for code, ns in NEEDLES.items() for n in ns if n in text]


# ---- Python sources: string nodes rendered with {} for what is computed ----


def render(node: ast.AST) -> str | None:
    """The message a string-valued expression prints, computed parts as {}; None when it is not a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return PRINTF.sub("{}", node.value.replace("%%", "\0")).replace("\0", "%")
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = render(node.left), render(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{}") + (right if right is not None else "{}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return render(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = render(node.func.value)
        return re.sub(r"\{[^{}]*\}", "{}", base) if base is not None else None
    return None


def _how_printed(parents: list[ast.AST]) -> str:
    for node in reversed(parents):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            return f"raise:{name}" if name else "text"
        if isinstance(node, ast.Assert):
            return "raise:AssertionError"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOG_CALLS:
            return "log"
    return "text"


def python_templates(source: str, where: str) -> Iterator[tuple[str, int, str]]:
    """(message, line, how printed) of every outermost string expression holding a needle."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    yield from _walk(tree, [], where)


def _walk(node: ast.AST, parents: list[ast.AST], where: str) -> Iterator[tuple[str, int, str]]:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return  # a docstring: documentation, never printed as a failure
    text = render(node) if isinstance(node, ast.expr) else None
    if text is not None and needles_in(text):
        yield text, getattr(node, "lineno", 0), _how_printed(parents)
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, [*parents, node], where)


# ---- C/C++ sources: the literals of the statement around the needle ----


def c_templates(source: str) -> Iterator[tuple[str, int, str]]:
    lines = source.splitlines()
    for number, line in enumerate(lines, 1):
        if '"' not in line or not needles_in(" ".join(LITERAL.findall(line))):
            continue
        start = number - 1
        while start > 0 and not lines[start - 1].rstrip().endswith((";", "{", "}")) and number - start < 4:
            start -= 1
        end = number - 1
        while end < len(lines) - 1 and ";" not in lines[end] and end - number < 4:
            end += 1
        statement = " ".join(lines[start : end + 1])
        yield _c_message(statement), number, _c_printed(statement)


def _c_message(statement: str) -> str:
    """A stream (``<< "a" << x << "b"``) joins its literals with {} between; a printf-style call's format is its
    first run of adjacent literals (later literals are arguments)."""
    if "<<" in statement:
        parts = []
        for piece in statement.split("<<"):
            found = LITERAL.findall(piece)
            parts.append("".join(found) if found else "{}")
        text = "".join(parts)
    else:
        run = FORMAT_RUN.search(statement)
        text = "".join(LITERAL.findall(run.group())) if run else ""
    text = " ".join(bytes(text, "utf-8").decode("unicode_escape", errors="replace").split("\n")).strip()
    return re.sub(r"(?:\{\})+", "{}", PRINTF.sub("{}", text.replace("%%", "\0")).replace("\0", "%")).strip()


def _c_printed(statement: str) -> str:
    """NCCL's WARN and INFO macros print with the NCCL prefix; ncclGetErrorString's strings come back through the
    caller (torch prints them after "NCCL error in: <file>:<line>, ")."""
    if re.search(r'\breturn\s+"', statement):
        return "nccl-error-string"
    macro = NCCL_MACRO.search(statement)
    return f"nccl-{macro.group(1).lower()}" if macro else "text"


# ---- binaries: printable strings holding a needle ----


def binary_templates(data: bytes) -> Iterator[tuple[str, int, str]]:
    for match in re.finditer(rb"[\x20-\x7e]{12,}", data):
        text = match.group().decode("ascii")
        if needles_in(text):
            yield re.sub(r"\{[^{}]*\}", "{}", PRINTF.sub("{}", text)).strip(), 0, "text"


# ---- sources ----


@dataclass(frozen=True)
class Source:
    kind: str  # git, wheel, tree
    repo: str
    tag: str
    path: Path

    @classmethod
    def parse(cls, kind: str, text: str) -> Source:
        repo, tag, path = split_spec(kind, text, FORM)
        return cls(kind, repo, tag, Path(path))

    def files(self) -> Iterator[tuple[str, bytes]]:
        """(path inside the release, content) of every file that may hold a needle."""
        if self.kind == "git":
            yield from self._git_files()
        elif self.kind == "wheel":
            with zipfile.ZipFile(self.path) as wheel:
                for name in wheel.namelist():
                    if name.endswith(PY_SUFFIXES) or BINARIES.search(name):
                        yield name, wheel.read(name)
        else:
            for path in sorted(self.path.rglob("*")):
                rel = f"{self.path.name}/{path.relative_to(self.path)}"
                if path.is_file() and (path.suffix in PY_SUFFIXES or BINARIES.search(rel)):
                    yield rel, path.read_bytes()

    def _git_files(self) -> Iterator[tuple[str, bytes]]:
        pattern = [arg for n in {n for ns in NEEDLES.values() for n in ns} for arg in ("-e", n)]
        for line in git(self.path, "grep", "-l", "-F", *pattern, self.tag, "--", "src").decode().splitlines():
            name = line.split(":", 1)[1]
            if name.endswith(C_SUFFIXES):
                yield name, git_show(self.path, self.tag, name)


def scan(source: Source) -> Iterator[tuple[str, int, str, str]]:
    """(path, line, message, how printed) of every template in one source."""
    for name, content in source.files():
        if name.endswith(PY_SUFFIXES):
            text = content.decode("utf-8", errors="replace")
            if needles_in(text):
                for message, line, printed in python_templates(text, name):
                    yield name, line, message, printed
        elif name.endswith(C_SUFFIXES):
            for message, line, printed in c_templates(content.decode("utf-8", errors="replace")):
                yield name, line, message, printed
        else:
            for message, line, printed in binary_templates(content):
                yield name, line, message, printed


def skipped(code: str, printed: str, message: str) -> bool:
    return any(c in ("", code) and p == printed and re.search(r, message) for c, p, r, _ in SKIP)


def build(sources: Iterable[Source]) -> dict[str, object]:
    table: dict[tuple[str, str], Template] = {}
    for source in sources:
        for name, line, message, printed in scan(source):
            for code, needle in needles_in(message):
                if skipped(code, printed, message):
                    continue
                key = (code, message)
                entry = table.setdefault(key, Template(code, message, printed, samples=SAMPLES.get(needle, [])))
                where = f"{source.repo}@{source.tag}:{name}" + (f":{line}" if line else " (a string in the binary)")
                entry.origins.append(where)
    signatures: dict[str, list[dict[str, object]]] = {code: [] for code in NEEDLES}
    for (code, _), entry in sorted(table.items()):
        item: dict[str, object] = {"template": entry.text, "printed": entry.printed, "origins": entry.origins}
        if entry.samples:
            item["samples"] = entry.samples
        signatures[code].append(item)
    listed = [f"{s.kind} {s.repo}@{s.tag}" for s in sources]
    return {"generated_by": "scripts/signature-templates.py", "sources": listed, "signatures": signatures}


def main(argv: list[str] | None = None) -> int:
    sources, out = parse_command_line(__doc__.split("\n\n")[0], KINDS, FORM, Source.parse, argv)
    table = build(sources)
    write_table(out, table)
    counts = {code: len(items) for code, items in table["signatures"].items()}  # type: ignore[attr-defined]
    print(json.dumps(counts, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

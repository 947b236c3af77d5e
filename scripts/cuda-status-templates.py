#!/usr/bin/env python3
"""Regenerate src/dgxdoctor/data/cuda_status_templates.json: every error the CUDA runtime can name, and every status
of cuBLAS, cuSPARSE and cuDNN, read from NVIDIA's own packages.

- The CUDA runtime: the ``cudaError`` enum of ``include/driver_types.h`` (name and number) and the message
  ``cudaGetErrorString`` returns for each, asked of ``lib/libcudart.so.*`` itself (loaded with ctypes: a table
  look-up that needs no GPU or driver). Both from the ``nvidia-cuda-runtime-cu12`` wheel.
- cuBLAS, cuSPARSE, cuDNN: the ``cublasStatus_t``, ``cusparseStatus_t`` and ``cudnnStatus_t`` enums of
  ``cublas_api.h``, ``cusparse.h`` and ``cudnn_graph.h`` (``cudnn.h`` before cuDNN 9), from the
  ``nvidia-cublas-cu12``, ``nvidia-cusparse-cu12`` and ``nvidia-cudnn-cu12`` wheels.

The wheels are fetched with ``pip download --no-deps nvidia-cuda-runtime-cu12 nvidia-cublas-cu12
nvidia-cusparse-cu12 nvidia-cudnn-cu12 -d $WHEELS`` and read as zip files; nothing of them is kept but the names,
numbers and messages, with each wheel's file name and SHA-256.

    python3 scripts/cuda-status-templates.py --wheels $WHEELS --out src/dgxdoctor/data/cuda_status_templates.json

tests/unit/test_cuda_status_catalog.py prints every message and status the way PyTorch, vLLM and the CUDA runtime
do and asserts ``dgxdoctor diagnose`` names each (data/signatures.toml: CUDA_RUNTIME_ERROR, CUDA_LIBRARY_ERROR, or
the more specific class that owns the message). Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import re
import sys
import tempfile
import zipfile
from pathlib import Path

ENUM_MEMBER = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<value>-?(?:0x[0-9a-fA-F]+|\d+))\s*,?", re.M)
# (wheel name prefix, header path inside it, enum that opens the block, enumerator prefix)
LIBRARIES = {
    "cublas": ("nvidia_cublas_cu12", "nvidia/cublas/include/cublas_api.h", "CUBLAS_STATUS_"),
    "cusparse": ("nvidia_cusparse_cu12", "nvidia/cusparse/include/cusparse.h", "CUSPARSE_STATUS_"),
    "cudnn": ("nvidia_cudnn_cu12", "nvidia/cudnn/include/cudnn_graph.h", "CUDNN_STATUS_"),
}


def _wheel(folder: Path, prefix: str) -> Path | None:
    found = sorted(folder.glob(f"{prefix}-*.whl"))
    return found[-1] if found else None


def _describe(wheel: Path) -> dict[str, str]:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return {"wheel": wheel.name, "sha256": digest}


def runtime_errors(wheel: Path) -> list[dict[str, object]]:
    """(name, number, message) of every ``cudaError`` enumerator: the numbers from the header, the name and message
    from the library itself (``cudaGetErrorName``/``cudaGetErrorString`` are table look-ups: no GPU, no driver)."""
    with zipfile.ZipFile(wheel) as z:
        header = z.read("nvidia/cuda_runtime/include/driver_types.h").decode()
        library = next(n for n in z.namelist() if re.search(r"lib/libcudart\.so\.\d+$", n))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(z.extract(library, tmp))
            cudart = ctypes.CDLL(str(path))
            cudart.cudaGetErrorString.restype = ctypes.c_char_p
            cudart.cudaGetErrorName.restype = ctypes.c_char_p
            block = header[header.index("enum __device_builtin__ cudaError\n") :]
            block = block[: block.index("};")]
            numbers = {m["name"]: int(m["value"], 0) for m in ENUM_MEMBER.finditer(block)}
            out = []
            for name, value in sorted(numbers.items(), key=lambda kv: kv[1]):
                said = cudart.cudaGetErrorName(ctypes.c_int(value)).decode()
                if said != name:  # an alias (cudaErrorApiFailureBase) or a number the library does not know
                    continue
                out.append({"name": name, "value": value, "message": cudart.cudaGetErrorString(value).decode()})
            return out


def statuses(wheel: Path, header: str, prefix: str) -> list[dict[str, object]]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        path = header if header in names else header.replace("cudnn_graph.h", "cudnn.h")
        text = z.read(path).decode(errors="replace")
    found = {m["name"]: int(m["value"], 0) for m in ENUM_MEMBER.finditer(text) if m["name"].startswith(prefix)}
    return [{"name": n, "value": v} for n, v in sorted(found.items(), key=lambda kv: (kv[1], kv[0]))]


def build(folder: Path) -> dict[str, object]:
    runtime = _wheel(folder, "nvidia_cuda_runtime_cu12")
    if runtime is None:
        raise SystemExit(f"{folder}: no nvidia_cuda_runtime_cu12 wheel")
    sources = [_describe(runtime)]
    table: dict[str, object] = {"generated_by": "scripts/cuda-status-templates.py", "sources": sources}
    table["cuda_runtime"] = runtime_errors(runtime)
    for library, (prefix, header, enum_prefix) in LIBRARIES.items():
        wheel = _wheel(folder, prefix)
        if wheel is None:
            print(f"{library}: no {prefix} wheel in {folder}; left out", file=sys.stderr)
            continue
        sources.append(_describe(wheel))
        table[library] = statuses(wheel, header, enum_prefix)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, required=True, help="the folder pip download wrote the wheels to")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    table = build(args.wheels)
    args.out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    counts = {k: len(v) for k, v in table.items() if isinstance(v, list) and k != "sources"}
    print(json.dumps(counts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Capture what NVML reports on a GPU node, as a test fixture for the gpu check.

Prints one JSON document on stdout:
  - ``system`` and ``gpus``: every raw value ``dgxdoctor.sources.nvml.read_raw()`` reads (the same reads the gpu
    check makes), errors recorded as ``{"error": kind, "message": ...}``. This is the fixture format that
    tests/fake_nvml.py replays: save it under tests/fixtures/nvml/.
  - ``snapshots``: the same values as the check interprets them (``GpuSnapshot``), for review.
  - ``timing``: nvmlInit, the first full sweep (every GPU), then repeated sweeps.
  - ``xid_events``: what the NVML event API does here: supported event types per GPU, registering for
    ``nvmlEventTypeXidCriticalError``, one ``nvmlEventSetWait`` of 1000 ms (a timeout error when nothing happened).
It always exits 0; anything that fails is recorded in the document.

Needs only the standard library, ``pynvml`` (package nvidia-ml-py) and this repository's src/:

    PYTHONPATH=src python3 scripts/gpu-capture.py > gpu-capture.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from typing import Any

from dgxdoctor.records import asdict


def _module_version(module: Any) -> str | None:
    try:
        from importlib.metadata import version

        return version("nvidia-ml-py")
    except Exception:
        return getattr(module, "__version__", None)


def _nvml_error(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "code": getattr(exc, "value", None), "message": str(exc)}


def probe_xid_events(pynvml: Any, count: int, wait_ms: int) -> dict[str, Any]:
    """Register every GPU for XID critical errors and wait once; report each step's outcome."""
    out: dict[str, Any] = {"event_type": "nvmlEventTypeXidCriticalError", "wait_ms": wait_ms, "gpus": []}
    try:
        event_set = pynvml.nvmlEventSetCreate()
    except Exception as exc:
        out["create"] = _nvml_error(exc)
        return out
    out["create"] = "ok"
    registered = 0
    for index in range(count):
        entry: dict[str, Any] = {"index": index}
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            entry["handle"] = _nvml_error(exc)
            out["gpus"].append(entry)
            continue
        try:
            entry["supported_event_types"] = hex(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
        except Exception as exc:
            entry["supported_event_types"] = _nvml_error(exc)
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            entry["register"] = "ok"
            registered += 1
        except Exception as exc:
            entry["register"] = _nvml_error(exc)
        out["gpus"].append(entry)
    if registered:
        t0 = time.monotonic()
        try:
            data = pynvml.nvmlEventSetWait(event_set, wait_ms)
            out["wait"] = {
                "event_type": hex(int(data.eventType)),
                "event_data": int(data.eventData),  # the XID number for XID events
                "gpu_instance_id": int(data.gpuInstanceId),
                "compute_instance_id": int(data.computeInstanceId),
            }
            try:
                out["wait"]["uuid"] = str(pynvml.nvmlDeviceGetUUID(data.device))
            except Exception as exc:
                out["wait"]["uuid"] = _nvml_error(exc)
        except Exception as exc:
            out["wait"] = _nvml_error(exc)
        out["wait_elapsed_s"] = round(time.monotonic() - t0, 4)
    try:
        pynvml.nvmlEventSetFree(event_set)
        out["free"] = "ok"
    except Exception as exc:
        out["free"] = _nvml_error(exc)
    return out


def capture(repeat: int, wait_ms: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "source": "scripts/gpu-capture.py",
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "errors": [],
    }
    try:
        import pynvml
    except ImportError as exc:
        doc["errors"].append(f"import pynvml: {exc}")
        return doc
    doc["nvidia_ml_py"] = _module_version(pynvml)

    from dgxdoctor.sources.nvml import (
        GpuSnapshot,
        PynvmlClient,
        format_cuda_version,
        read_raw,
        read_system_raw,
        sweep,
    )

    client = PynvmlClient()
    timing: dict[str, Any] = {}
    doc["timing"] = timing
    t0 = time.perf_counter()
    try:
        client.init()
    except Exception as exc:
        doc["errors"].append(f"init: {type(exc).__name__}: {exc}")
        return doc
    timing["init_s"] = round(time.perf_counter() - t0, 6)

    try:
        doc["system"] = read_system_raw(client)
        cuda = doc["system"].get("cuda_driver_version")
        if isinstance(cuda, int):
            doc["cuda_driver_version_text"] = format_cuda_version(cuda)
        count = client.device_count()
        doc["device_count"] = count

        # First full read, per GPU, kept raw: this is the fixture.
        gpus = []
        per_gpu = []
        for index in range(count):
            t1 = time.perf_counter()
            gpus.append(read_raw(client, index))
            per_gpu.append(round(time.perf_counter() - t1, 6))
        timing["first_read_per_gpu_s"] = per_gpu
        doc["gpus"] = gpus
        doc["snapshots"] = [asdict(GpuSnapshot.from_raw(i, raw)) for i, raw in enumerate(gpus)]

        sweeps = []
        for _ in range(repeat):
            t1 = time.perf_counter()
            sweep(client)
            sweeps.append(round(time.perf_counter() - t1, 6))
        timing["repeat_sweep_s"] = sweeps
        if sweeps:
            timing["repeat_sweep_mean_s"] = round(sum(sweeps) / len(sweeps), 6)
    except Exception as exc:
        doc["errors"].append(f"sweep: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        count = int(doc.get("device_count") or 0)

    try:
        doc["xid_events"] = probe_xid_events(pynvml, count, wait_ms)
    except Exception as exc:
        doc["errors"].append(f"xid events: {type(exc).__name__}: {exc}")

    try:
        client.shutdown()
    except Exception as exc:
        doc["errors"].append(f"shutdown: {type(exc).__name__}: {exc}")
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="repeated full sweeps to time (default 10)")
    parser.add_argument("--wait-ms", type=int, default=1000, help="nvmlEventSetWait timeout (default 1000)")
    args = parser.parse_args()
    try:
        doc = capture(args.repeat, args.wait_ms)
    except Exception as exc:  # the capture must always produce a document
        doc = {"errors": [f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"]}
    json.dump(doc, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
    timing = doc.get("timing", {})
    print(
        f"gpus={doc.get('device_count')} init={timing.get('init_s')}s first={timing.get('first_read_per_gpu_s')} "
        f"repeat_mean={timing.get('repeat_sweep_mean_s')}s errors={len(doc.get('errors', []))}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

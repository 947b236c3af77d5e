"""Capture before acting: the bundle is taken before the restart runs, named in both audit lines, never delays the
restart past its deadline, the last N are kept; for a cluster restart the worker's part comes over the API."""

from __future__ import annotations

import asyncio
import json
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from msgspec.structs import replace
from test_remediation_engine import DEAD, events, remediator, settle, vllm_app

from dgxdoctor.config import Config, parse_config
from dgxdoctor.daemon import bundle_part
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.daemon.bundle_part import BundlePart, capture_writer, pre_action_capture
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.remediation.capture import CaptureSettings, PreActionCapture
from dgxdoctor.remediation.status import render_status, status_document
from dgxdoctor.result import CheckResult, Status
from tokens import one_token
from webtest import TestServer

TOKEN = "capture-test-token-0123456789"


def node_config(tmp: Path, name: str, **bundle: Any) -> Config:
    (tmp / name).mkdir(exist_ok=True)
    kmsg = tmp / name / "kmsg.txt"
    kmsg.write_text("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n")
    return parse_config(
        {
            "node": name,
            "paths": {"state_dir": str(tmp / name / "state"), "kmsg_path": str(kmsg), "sysfs_root": str(tmp / "sys")},
            "daemon": {"token": TOKEN, "check_run_min_interval_s": 0},
            "bundle": bundle,
            "checks": {"logs": {"ray_paths": []}, "ray": {"ray_command": "/nonexistent/ray"}},
        }
    )


async def test_the_restart_runs_after_the_capture_and_both_audit_lines_name_it(tmp_path: Path) -> None:
    config = node_config(tmp_path, "dgx-a")
    store = ResultStore("dgx-a")
    store.put(DEAD)
    marker = tmp_path / "restarted"
    r = remediator(
        config.paths.state_dir, vllm_app([]), {"vllm": DEAD}, commands={"restart_vllm": ["touch", str(marker)]}
    )
    r.capture = pre_action_capture(lambda: config, config.environment, store, lambda: ())
    await settle(r)
    started, done = [e for e in events(config.paths.state_dir) if e["event"] in ("action_started", "action")]
    bundle = Path(done["bundle"])
    assert started["bundle"] == done["bundle"] and bundle.parent == config.paths.state_dir / "bundles"
    assert bundle.exists() and done["capture"].startswith("complete") and done["outcome"] == "success"
    assert bundle.stat().st_mtime <= marker.stat().st_mtime  # the evidence was written before the restart ran
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        results = json.loads(tar.extractfile(next(n for n in names if n.endswith("dgx-a/results.json"))).read())  # type: ignore[union-attr]
        kernel = tar.extractfile(next(n for n in names if n.endswith("dgx-a/kernel.log"))).read()  # type: ignore[union-attr]
    assert results["checks"][0]["status"] == "critical"  # the daemon's results as they were before the restart
    assert b"fallen off the bus" in kernel
    # `dgxdoctor remediation status` and the status page (which reads the same document) name it too.
    status = status_document(config.__class__(replace(config.model, remediation=r.settings), "x"))
    assert status["last_actions"][-1]["bundle"] == done["bundle"]
    assert f"evidence: {done['bundle']}" in render_status(status)


async def test_a_slow_capture_never_delays_the_restart_past_its_deadline(tmp_path: Path) -> None:
    released = threading.Event()  # the capture is still writing until the restart has ended

    def slow(path: Path, action: str, collect_s: float) -> dict[str, Any]:
        released.wait(30)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"late")
        return {"failures": []}

    state = tmp_path / "state"
    r = remediator(state, vllm_app([]), {"vllm": DEAD})
    r.capture = PreActionCapture(slow, lambda: state, lambda: "dgx-a", lambda: CaptureSettings(True, 0.5, 3))
    t0 = time.monotonic()
    await settle(r)
    took = time.monotonic() - t0
    done = events(state)[-1]
    assert done["outcome"] == "success" and "the restart did not wait" in done["capture"]
    assert done["capture_s"] < 2.0 and took < 3.0
    released.set()
    for task in list(r.capture.pending):
        await task  # the archive is still finished, after the restart
    assert Path(done["bundle"]).read_bytes() == b"late"


async def test_only_the_last_n_captures_are_kept(tmp_path: Path) -> None:
    config = node_config(tmp_path, "dgx-a", keep=2, capture_deadline_s=5)
    capture = pre_action_capture(lambda: config, config.environment, ResultStore("dgx-a"), lambda: ())
    paths = []
    for i in range(4):
        paths.append((await capture.before("restart_vllm", f"id{i}"))["bundle"])
        await asyncio.sleep(0.02)
    kept = sorted(p.name for p in (config.paths.state_dir / "bundles").iterdir())
    assert kept == sorted(Path(p).name for p in paths[-2:])


async def test_a_cluster_restart_captures_the_workers_part_too(tmp_path: Path) -> None:
    head, worker = node_config(tmp_path, "dgx-a"), node_config(tmp_path, "dgx-b")
    wstore = ResultStore("dgx-b")
    wstore.put(CheckResult("ray", Status.CRITICAL, "raylet dead"))
    state = AppState(wstore, make_registry(wstore), lambda: {"healthy": True, "clock": time.time()}, one_token(TOKEN))
    service = BundlePart(lambda: worker, worker.environment, wstore)
    state.extra_routes = lambda app: bundle_part.add_routes(app, service)
    server = TestServer(make_app(state), host="127.0.0.1")
    await server.start_server()
    try:
        url = f"http://127.0.0.1:{server.port}"
        write = capture_writer(lambda: head, head.environment, ResultStore("dgx-a"), lambda: (url,))
        out = tmp_path / "c.tar.gz"
        top = await asyncio.to_thread(write, out, "restart_cluster", 4.0)
        async with httpx.AsyncClient() as client:
            unauthenticated = await client.post(f"{url}/bundle/part", json={"since_s": 60})
    finally:
        await server.close()
    assert [n["node"] for n in top["nodes"]] == ["dgx-a", "dgx-b"]
    assert top["nodes"][1]["error"] is None and top["nodes"][1]["clock_offset_s"] is not None
    with tarfile.open(out) as tar:
        names = tar.getnames()
        wresults = json.loads(tar.extractfile("c/dgx-b/results.json").read())  # type: ignore[union-attr]
    assert "c/dgx-a/manifest.json" in names and "c/dgx-b/manifest.json" in names
    assert wresults["checks"][0]["summary"] == "raylet dead"
    assert unauthenticated.status_code == 401


async def test_a_broken_capture_never_stops_the_restart(tmp_path: Path) -> None:
    def broken() -> CaptureSettings:
        raise RuntimeError("settings gone")

    state = tmp_path / "state"
    r = remediator(state, vllm_app([]), {"vllm": DEAD})
    r.capture = PreActionCapture(lambda *a: {}, lambda: state, lambda: "dgx-a", broken)
    await settle(r)
    done = events(state)[-1]
    assert done["outcome"] == "success" and done["capture"] == "failed: RuntimeError: settings gone"

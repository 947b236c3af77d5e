"""The service commands of one test "node", as remediation's argv lists run them (standing in for `systemctl
start|stop|restart vllm.service / ray-head.service / ray-worker.service`).

``python remediation_node.py DIR vllm-start|vllm-stop|vllm-restart|ray-start|ray-stop``. ``DIR/node.json`` holds
the node's vLLM and Ray command lines and environments (with ``cpus``, the cores each may run on). Like systemd
with Type=simple units, a start returns once the process is spawned (in its own session, so it outlives whoever
started it); a stop ends the whole process group (vLLM: SIGCONT, SIGTERM, SIGKILL after the spec's
``stop_grace_s``, default 10 s) or the node's PID namespace (Ray). Each spawn and stop is appended to
``DIR/events.jsonl`` with its time (the benchmark reads vLLM's spawn time there).
Stdlib only: it runs under any Python.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _event(node: Path, what: str, **extra: object) -> None:
    with (node / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": what, **extra}) + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _spawn(node: Path, name: str, spec: dict[str, object]) -> None:
    env = {**os.environ, **spec.get("env", {})}  # type: ignore[dict-item]
    log = (node / f"{name}.log").open("ab")
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    cpus = spec.get("cpus")  # the cores it may run on, as if they were its machine's own (absent: any core)

    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # type: ignore[arg-type]

    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, cwd=node, preexec_fn=pin)  # fmt: skip
    (node / f"{name}.pid").write_text(f"{proc.pid}\n")
    _event(node, f"{name}-start", pid=proc.pid)


def _stop(node: Path, name: str, grace_s: float) -> None:
    pid_file = node / f"{name}.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    for sig in (signal.SIGCONT, signal.SIGTERM if grace_s else signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _event(node, f"{name}-stop", pid=pid)


def main(node: Path, verb: str) -> int:
    spec = json.loads((node / "node.json").read_text())
    grace = float(spec.get("vllm", {}).get("stop_grace_s", 10.0))  # SIGTERM to SIGKILL, as a unit's TimeoutStopSec
    if verb == "vllm-stop":
        _stop(node, "vllm", grace)
    elif verb == "vllm-start":
        _spawn(node, "vllm", spec["vllm"])
    elif verb == "vllm-restart":
        _stop(node, "vllm", grace)
        _spawn(node, "vllm", spec["vllm"])
    elif verb == "ray-stop":
        _stop(node, "ray", 0.0)  # --kill-child: the PID namespace dies with its first process
    elif verb == "ray-start":
        _spawn(node, "ray", spec["ray"])
    else:
        print(f"unknown verb {verb!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))

"""Collect one node's part of a bundle: every item at once on a few threads, under one deadline and one size cap.

Each item says where its bytes come from (a command, run as argv through the command runner with a timeout no
longer than what is left of the deadline, or a file, or the agent's own state). Whatever happens to an item is in
the manifest: its command, exit code, duration and byte count, or why it failed, timed out or was cut. Nothing is
dropped silently. The worker threads are daemon threads: a read stuck in the kernel past the deadline is left
behind and listed as timed out; it cannot hold the bundle or the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from msgspec import Struct, field
from msgspec.structs import replace

from dgxdoctor.bundle.redact import Redactor
from dgxdoctor.sources.commands import CommandNotFound, CommandRunner, CommandTimeout

WORKERS = 4
# Files whose end matters most (logs, everything under logs/): cut from the front at the size cap; others keep their
# head.
KEEP_TAIL = (".log", ".jsonl")


class Output(Struct, frozen=True):
    """What one item produced. ``status``: ok, failed (ran, non-zero exit or unreadable), missing (the tool or
    file is not here), timeout (its own timeout or the bundle's deadline), skipped (not applicable)."""

    data: bytes = b""
    status: str = "ok"
    command: tuple[str, ...] | None = None
    exit_code: int | None = None
    error: str | None = None


class Item(Struct, frozen=True):
    name: str  # path inside the node's folder of the archive
    source: str  # what an operator would run or read by hand
    produce: Callable[[float], Output]  # seconds left -> output


class Part(Struct):
    """One node's files and its manifest."""

    node: str
    files: list[tuple[str, bytes]] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)


def command_item(name: str, argv: Sequence[str], timeout_s: float, runner: CommandRunner) -> Item:
    """``argv`` through the project's command runner (never a shell), timed out at its timeout or the deadline."""

    def produce(left_s: float) -> Output:
        cmd = tuple(argv)
        budget = min(timeout_s, left_s)
        if budget <= 0:
            return Output(status="timeout", command=cmd, error="the bundle's deadline had passed")
        try:
            done = runner(list(argv), timeout_s=budget)
        except CommandNotFound as exc:
            return Output(status="missing", command=cmd, error=str(exc))
        except CommandTimeout as exc:
            return Output(status="timeout", command=cmd, error=str(exc))
        except OSError as exc:
            return Output(status="failed", command=cmd, error=f"{type(exc).__name__}: {exc}")
        data = done.stdout.encode("utf-8", "replace")
        if done.returncode != 0:
            err = done.stderr.strip()[-500:]
            data += f"\n--- stderr ---\n{done.stderr}".encode("utf-8", "replace") if done.stderr else b""
            return Output(data, "failed", cmd, done.returncode, f"exit {done.returncode}: {err}" if err else None)
        return Output(data, "ok", cmd, 0)

    return Item(name, " ".join(argv), produce)


def _run(item: Item, end: float, out: dict[str, tuple[Output, float]], lock: threading.Lock) -> None:
    t0 = time.monotonic()
    try:
        got = item.produce(end - t0)
    except Exception as exc:  # one broken item never costs the others
        got = Output(status="failed", error=f"{type(exc).__name__}: {exc}"[:500])
    with lock:
        out[item.name] = (got, time.monotonic() - t0)


def run_items(items: Sequence[Item], deadline_s: float) -> tuple[dict[str, tuple[Output, float]], bool]:
    """Every item's (output, seconds); items unfinished at the deadline are missing from the result. Also whether
    the deadline was reached."""
    end = time.monotonic() + deadline_s
    out: dict[str, tuple[Output, float]] = {}
    lock = threading.Lock()
    queue = list(items)
    queue_lock = threading.Lock()

    def worker() -> None:
        while time.monotonic() < end:
            with queue_lock:
                if not queue:
                    return
                item = queue.pop(0)
            _run(item, end, out, lock)

    threads = [threading.Thread(target=worker, name="bundle", daemon=True) for _ in range(min(WORKERS, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(end - time.monotonic(), 0))
    with lock:
        return dict(out), len(out) < len(items)


def _cut(name: str, data: bytes, room: int) -> bytes:
    if len(data) <= room:
        return data
    tail = name.endswith(KEEP_TAIL) or name.startswith("logs/")
    return data[len(data) - room :] if tail else data[:room]


def collect(node: str, items: Sequence[Item], deadline_s: float, size_cap: int, redactor: Redactor) -> Part:
    """Run the items; redact every file, cut files past the size cap, write the manifest."""
    t0 = time.monotonic()
    got, deadline_hit = run_items(items, deadline_s)
    part = Part(node)
    entries: list[dict[str, Any]] = []
    used = 0
    cap_hit = False
    for item in items:
        output, seconds = got.get(item.name, (None, deadline_s))
        if output is None:
            output = Output(status="timeout", error=f"not finished within the bundle's deadline ({deadline_s:g} s)")
        data = redactor.data(output.data) if output.data else b""
        kept = _cut(item.name, data, max(size_cap - used, 0))
        if len(kept) < len(data):
            cap_hit = True
            output = replace(output, error=(output.error or "") + f" cut at the size cap: {len(data)} bytes, kept "
                             f"{len(kept)}".lstrip())  # fmt: skip
        used += len(kept)
        if kept or (output.status == "ok" and not data):  # a file cut to nothing is only in the manifest
            part.files.append((item.name, kept))
        entries.append(_entry(item, output, seconds, len(kept), len(data), len(kept) < len(data)))
    part.manifest = {
        "node": node,
        "files": entries,
        "failures": [e for e in entries if e["status"] != "ok"],
        "limits": {
            "size_cap_bytes": size_cap,
            "size_cap_hit": cap_hit,
            "deadline_s": deadline_s,
            "deadline_hit": deadline_hit,
        },
        "bytes": used,
        "duration_s": round(time.monotonic() - t0, 3),
    }
    return part


def _entry(item: Item, output: Output, seconds: float, kept: int, total: int, cut: bool) -> dict[str, Any]:
    return {
        "file": item.name,
        "source": item.source,
        "command": list(output.command) if output.command else None,
        "exit_code": output.exit_code,
        "status": output.status,
        "duration_s": round(seconds, 3),
        "bytes": kept,
        "bytes_before_cap": total if cut else None,
        "error": output.error,
    }

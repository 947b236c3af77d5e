"""Record NCCL's RAS client protocol byte for byte (stdlib only; run on the GPU test machine by scripts/h200-ras.sh).

``record.py sessions OUTDIR [--port 28028] [--label L]``: one fresh connection per session below, each command sent
as NCCL's ncclras sends it (src/ras/client.cc), every chunk read back kept with its time; written to
``OUTDIR/<label>-sessions.json`` (base64 chunks, for the replay tests) and ``OUTDIR/<label>-<session>.txt`` (readable).

``record.py proxy OUTDIR --listen 28029 [--port 28028]``: a recording proxy for NCCL's own ``ncclras -p 28029``:
every chunk both ways to ``OUTDIR/proxy-sessions.json``; stops after ``--count`` connections.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

# (name, [(command, how the reply ends)]): "line" = until a newline, "eof" = until the server closes,
# "wait:S" = whatever comes within S seconds (MONITOR).
SESSIONS: list[tuple[str, list[tuple[str, str]]]] = [
    ("status", [("CLIENT PROTOCOL 2\n", "line"), ("TIMEOUT 5\n", "line"), ("STATUS\n", "eof")]),
    ("verbose", [("CLIENT PROTOCOL 2\n", "line"), ("TIMEOUT 5\n", "line"), ("VERBOSE STATUS\n", "eof")]),
    (
        "json",
        [
            ("CLIENT PROTOCOL 2\n", "line"),
            ("TIMEOUT 5\n", "line"),
            ("SET FORMAT json\n", "line"),
            ("VERBOSE STATUS\n", "eof"),
        ],
    ),
    ("default-timeout", [("CLIENT PROTOCOL 2\n", "line"), ("STATUS\n", "eof")]),
    (
        "errors",
        [
            ("CLIENT PROTOCOL 99\n", "line"),
            ("TIMEOUT -1\n", "line"),
            ("SET FORMAT xml\n", "line"),
            ("BOGUS\n", "line"),
            ("MONITOR bogus\n", "line"),
        ],
    ),
    ("monitor", [("CLIENT PROTOCOL 2\n", "line"), ("MONITOR all\n", "wait:3")]),
]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read(sock: socket.socket, how: str, t0: float, deadline_s: float) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    data = b""
    end = time.monotonic() + (float(how.split(":")[1]) if how.startswith("wait:") else deadline_s)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            chunks.append({"t": round(time.monotonic() - t0, 6), "event": "timeout"})
            return chunks
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError as exc:
            chunks.append({"t": round(time.monotonic() - t0, 6), "event": f"error {exc}"})
            return chunks
        if not chunk:
            chunks.append({"t": round(time.monotonic() - t0, 6), "event": "eof"})
            return chunks
        chunks.append({"t": round(time.monotonic() - t0, 6), "dir": "recv", "data": _b64(chunk)})
        data += chunk
        if how == "line" and data.endswith(b"\n"):
            return chunks


def record_session(port: int, commands: list[tuple[str, str]], deadline_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    out: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "events": []}
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError as exc:
        out["events"].append({"t": 0.0, "event": f"connect failed: {exc}"})
        return out
    with sock:
        for command, how in commands:
            out["events"].append({"t": round(time.monotonic() - t0, 6), "dir": "sent", "data": _b64(command.encode())})
            sock.sendall(command.encode())
            got = _read(sock, how, t0, deadline_s)
            out["events"].extend(got)
            if any(g.get("event") == "eof" or str(g.get("event", "")).startswith("error") for g in got):
                break
    out["seconds"] = round(time.monotonic() - t0, 6)
    return out


def readable(session: dict[str, Any]) -> str:
    lines = []
    for ev in session["events"]:
        if "data" in ev:
            arrow = ">>" if ev["dir"] == "sent" else "<<"
            lines.append(f"{ev['t']:10.6f} {arrow} {base64.b64decode(ev['data']).decode('utf-8', 'replace')!r}")
        else:
            lines.append(f"{ev['t']:10.6f} -- {ev['event']}")
    return "\n".join(lines) + "\n"


def sessions(outdir: Path, port: int, label: str, deadline_s: float) -> int:
    done: dict[str, Any] = {}
    for name, commands in SESSIONS:
        done[name] = record_session(port, commands, deadline_s)
        (outdir / f"{label}-{name}.txt").write_text(readable(done[name]))
    (outdir / f"{label}-sessions.json").write_text(json.dumps(done, indent=1))
    return 0


def _pump(src: socket.socket, dst: socket.socket, log: list[dict[str, Any]], direction: str, t0: float) -> None:
    while True:
        try:
            chunk = src.recv(65536)
        except OSError:
            chunk = b""
        log.append({"t": round(time.monotonic() - t0, 6), "dir": direction, "data": _b64(chunk)} if chunk
                   else {"t": round(time.monotonic() - t0, 6), "event": f"{direction} eof"})  # fmt: skip
        if not chunk:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        dst.sendall(chunk)


def proxy(outdir: Path, listen: int, port: int, count: int, deadline_s: float) -> int:
    server = socket.create_server(("127.0.0.1", listen))
    server.settimeout(deadline_s)
    done: dict[str, Any] = {}
    for index in range(count):
        try:
            client, _ = server.accept()
        except TimeoutError:
            break
        upstream = socket.create_connection(("127.0.0.1", port), timeout=deadline_s)
        t0, log = time.monotonic(), []  # type: ignore[var-annotated]
        threads = [threading.Thread(target=_pump, args=(client, upstream, log, "sent", t0)),
                   threading.Thread(target=_pump, args=(upstream, client, log, "recv", t0))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(deadline_s)
        client.close()
        upstream.close()
        done[f"ncclras-{index}"] = {"events": sorted(log, key=lambda e: e["t"])}
        (outdir / f"proxy-{index}.txt").write_text(readable(done[f"ncclras-{index}"]))
    (outdir / "proxy-sessions.json").write_text(json.dumps(done, indent=1))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("sessions", "proxy"))
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--port", type=int, default=28028)
    parser.add_argument("--listen", type=int, default=28029)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--label", default="ras")
    parser.add_argument("--deadline", type=float, default=30.0)
    args = parser.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.mode == "sessions":
        return sessions(args.outdir, args.port, args.label, args.deadline)
    return proxy(args.outdir, args.listen, args.port, args.count, args.deadline)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""A stand-in for `ray start ... --block` (installed as a program named ``ray``; its argv is Ray's own).

``ray start --head``: the head's listeners, the dashboard API on 8265 answering what a real Ray 2.60 head answered
(the captures in ``$RAY_STANDIN_FIXTURES``, tests/fixtures/ray, taken from two real Ray nodes) and the GCS port 6379
accepting connections. Each request reads the file ``$RAY_STANDIN_SCENARIO`` (``healthy``, ``dead``, ...) and
answers ``<scenario>-nodes-detail.json`` and ``<scenario>-cluster-status.json``: writing ``dead`` there is the
worker's node dying as the head's dashboard reports it. ``ray start --address=...``: a worker node. Either way a
child process named ``raylet`` runs (a program of that name beside this one), as Ray's does. Stdlib only."""

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

PATHS = {
    "/api/v0/nodes?detail=1": "nodes-detail.json",
    "/nodes?view=summary": "nodes-summary.json",
    "/api/cluster_status": "cluster-status.json",
}


def dashboard(fixtures, scenario):
    class Dashboard(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/api/version":
                body = (fixtures / "version.json").read_bytes()
            elif self.path in PATHS:
                body = (fixtures / f"{scenario.read_text().strip()}-{PATHS[self.path]}").read_bytes()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Dashboard


def main():
    args = sys.argv[1:]
    assert args[:1] == ["start"] and "--block" in args, f"only `ray start ... --block` is stood in for: {args}"
    raylet = subprocess.Popen([str(Path(sys.argv[0]).with_name("raylet")), "infinity"])
    print(f"Ray runtime started (stand-in): {' '.join(args)}", flush=True)
    if "--head" not in args:
        raylet.wait()
        return
    gcs = socket.create_server(("0.0.0.0", 6379))
    threading.Thread(target=lambda: [gcs.accept() for _ in iter(int, 1)], daemon=True).start()
    handler = dashboard(Path(os.environ["RAY_STANDIN_FIXTURES"]), Path(os.environ["RAY_STANDIN_SCENARIO"]))
    http.server.ThreadingHTTPServer(("0.0.0.0", 8265), handler).serve_forever()


if __name__ == "__main__":
    main()

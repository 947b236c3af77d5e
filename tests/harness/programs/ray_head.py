#!/usr/bin/env python3
"""A stand-in for the Ray head's listeners: the dashboard API on 8265 answering what a real Ray 2.60 head answered
(tests/fixtures/ray, captured from two real Ray nodes), and the GCS port 6379 accepting connections.

``ray_head.py FIXTURES SCENARIO_FILE``: each request reads SCENARIO_FILE (``healthy``, ``dead``, ...) and answers
``FIXTURES/<scenario>-nodes-detail.json`` and ``<scenario>-cluster-status.json``: writing ``dead`` there is the
worker's node dying as the head's dashboard reports it. Stdlib only."""

import http.server
import socket
import sys
import threading
from pathlib import Path

FIXTURES, SCENARIO = Path(sys.argv[1]), Path(sys.argv[2])
PATHS = {
    "/api/v0/nodes?detail=1": "nodes-detail.json",
    "/nodes?view=summary": "nodes-summary.json",
    "/api/cluster_status": "cluster-status.json",
}


class Dashboard(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/api/version":
            body = (FIXTURES / "version.json").read_bytes()
        elif self.path in PATHS:
            body = (FIXTURES / f"{SCENARIO.read_text().strip()}-{PATHS[self.path]}").read_bytes()
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


gcs = socket.create_server(("0.0.0.0", 6379))
threading.Thread(target=lambda: [gcs.accept() for _ in iter(int, 1)], daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8265), Dashboard).serve_forever()

"""A vLLM stand-in that misbehaves on demand: ``/health`` 200, ``/v1/models`` lists "tiny", and ``/metrics`` is
what the file MODE says: ``ok`` (a minimal vLLM exposition), ``garbage`` (random bytes) or ``huge`` (40 MiB).

Usage: ``python fake_vllm.py PORT MODE_FILE`` (stdlib only).
"""

from __future__ import annotations

import http.server
import json
import os
import sys
from pathlib import Path

MODE = Path(sys.argv[2])
OK = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.01\n'
)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(b"")
        elif self.path == "/v1/models":
            self._send(json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode())
        elif self.path == "/metrics":
            mode = MODE.read_text().strip() if MODE.exists() else "ok"
            if mode == "garbage":
                self._send(os.urandom(64 * 1024))
            elif mode == "huge":
                self._send(OK + b"# " + b"x" * (40 * 2**20) + b"\n")
            else:
                self._send(OK)
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()

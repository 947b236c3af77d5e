#!/usr/bin/env python3
"""A stand-in for `vllm serve MODEL ...` (installed as a program named ``vllm``; its argv is vLLM's own): the API
server answers /health, /v1/models, /metrics (an idle engine) and chat completions; with ``--nnodes N
--node-rank 0`` it also listens on ``--master-port`` (torch.distributed's store, which the workers reach); with
``--headless`` it serves nothing. Its rank processes are children titled ``VLLM::Worker_TP<rank>`` as vLLM's
setproctitle titles them. Stdlib only: a real vLLM is too heavy for the multi-node tests (test_vllm_real.py and
test_vllm_mp_real.py run the real one)."""

import argparse
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading

# VLLM_STANDIN_ENGINE=stalled: requests in flight and no counter moving (an engine that makes no step).
# VLLM_STANDIN_ENGINE_FILE: the engine's state read from that file at each /metrics request instead ("idle",
# "busy": requests in flight and the token counter moving, "stalled"), so a test can change it while vLLM runs.
STALLED = os.environ.get("VLLM_STANDIN_ENGINE") == "stalled"
ENGINE_FILE = os.environ.get("VLLM_STANDIN_ENGINE_FILE")


def engine():
    if ENGINE_FILE is None:
        return "stalled" if STALLED else "idle"
    try:
        with open(ENGINE_FILE) as f:
            return f.read().strip() or "idle"
    except OSError:
        return "idle"


METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.0\n'
    "# TYPE vllm:generation_tokens_total counter\n"
    'vllm:generation_tokens_total{{engine="0",model_name="{model}"}} {tokens}\n'
)


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("model")
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--distributed-executor-backend")
    p.add_argument("--headless", action="store_true")
    args, _ = p.parse_known_args(argv)
    return args


def main():
    args = parse(sys.argv[1:])
    model = args.served_model_name or args.model
    tokens = [0]
    per_node = max(1, args.tensor_parallel_size // args.nnodes)
    mp = args.nnodes > 1 or args.distributed_executor_backend == "mp"  # Ray's ranks are Ray's actors, not ours
    ranks = [
        subprocess.Popen([f"VLLM::Worker_TP{args.node_rank * per_node + r}", "infinity"], executable="/bin/sleep")
        for r in range(per_node if mp else 0)
    ]

    def stop(*_):
        for rank in ranks:
            rank.terminate()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)

    def say(*_):  # the test's lines (STANDIN_SAY), printed as vLLM's processes print theirs
        with open(os.environ["STANDIN_SAY"]) as lines:
            sys.stdout.write(lines.read())
        sys.stdout.flush()

    if "STANDIN_SAY" in os.environ:
        signal.signal(signal.SIGUSR1, say)
    where = "headless" if args.headless else f"API server on http://{args.host}:{args.port}"
    print(
        f"INFO [api_server.py:1] vLLM stand-in: {args.model}, node rank {args.node_rank} of {args.nnodes}, {where}",
        flush=True,
    )
    if args.nnodes > 1 and args.node_rank == 0:
        store = socket.create_server(("0.0.0.0", args.master_port))

        def accept():
            held = []
            while True:
                held.append(store.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
    if args.headless:
        signal.pause()
        return

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                self.send(b"", "application/json")
            elif self.path == "/v1/models":
                self.send(json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode())
            elif self.path == "/metrics":
                state = engine()
                if state == "busy":
                    tokens[0] += 37  # the engine steps: every read sees the counter moved
                text = METRICS.format(
                    model=model,
                    tokens=float(1200 if state == "stalled" else tokens[0]),
                    running=0.0 if state == "idle" else 4.0,
                    waiting=2.0 if state == "stalled" else 0.0,
                )
                self.send(text.encode(), "text/plain; version=0.0.4")
            else:
                self.send_error(404)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path in ("/v1/chat/completions", "/v1/completions"):
                tokens[0] += 1
                body = {"choices": [{"message": {"content": "OK"}, "text": "OK"}], "usage": {"completion_tokens": 1}}
                self.send(json.dumps(body).encode())
            else:
                self.send_error(404)

        def send(self, body, kind="application/json"):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer((args.host, args.port), Api).serve_forever()


if __name__ == "__main__":
    main()

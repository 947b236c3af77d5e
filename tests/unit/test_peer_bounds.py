"""Every peer exchange bounded in time and bytes, over real loopback sockets to a misbehaving peer
(``tests/peerstub.py``): the clock probe inside the one deadline and under its own byte cap, one deadline for any
number of peers, an error page read only to its first bytes, no NaN or infinity passed on from a peer, the peer
comparison's fetch kept for the status page, and a peer's tar part bounded before ``tarfile`` reads a header.

Bytes are counted where the client reads them (a transport under the daemon's own client), not as RSS.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import socket
import tarfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dgxdoctor.bundle.archive import BadPart, part_bytes, read_part
from dgxdoctor.bundle.collect import Part
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.cluster import NodeRun, ask_peers, cluster_document
from dgxdoctor.fleet.peer_states import PeerStates
from dgxdoctor.fleet.peers import MAX_PARALLEL_FETCHES, BadAnswer, fetch_all, read_answer
from dgxdoctor.result import Status
from peerstub import PeerStub, flood, results_doc, send_json, trickle

TOKEN = "bounds-test-token-0123456789"


class Counting(httpx.AsyncBaseTransport):
    """The real transport, counting the response bytes the client pulls off the socket."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.read = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        counter = self
        inner = response.stream
        assert isinstance(inner, httpx.AsyncByteStream)

        class Stream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in inner:
                    counter.read += len(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await inner.aclose()

        return httpx.Response(response.status_code, headers=response.headers, stream=Stream(),
                              extensions=response.extensions)  # fmt: skip

    async def aclose(self) -> None:
        await self.inner.aclose()


async def ask(urls: list[str], budget_s: float, cached: bool = False, transport: Counting | None = None,
              guard_s: float = 30.0) -> list[NodeRun]:  # fmt: skip
    """``ask_peers`` through the client the command makes (``Environment.async_http_client``); the test's own
    guard fails it rather than let the old code hang the suite."""
    env = Environment(http_transport=transport or Counting())
    async with env.async_http_client(budget_s) as client:
        return await asyncio.wait_for(ask_peers(client, urls, TOKEN, budget_s, cached), guard_s)


async def test_a_peer_flooding_healthz_is_unknown_named_after_a_few_kib() -> None:
    counting = Counting()
    with PeerStub("dgx-flood", {"/healthz": flood}) as stub:
        t0 = time.monotonic()
        (run,) = await ask([stub.url], 10.0, transport=counting)
        took = time.monotonic() - t0
    assert run.status is Status.UNKNOWN and run.node == f"127.0.0.1:{stub.port}"
    assert "/healthz" in (run.error or "") and "larger than" in (run.error or ""), run.error
    assert counting.read < 256 * 2**10, counting.read  # today: the transport's 32 MiB cap, then no clock, peer OK
    assert took < 5.0, took


async def test_a_trickling_healthz_ends_with_the_deadline_and_names_the_request() -> None:
    with PeerStub("dgx-trickle", {"/healthz": trickle}) as stub:
        t0 = time.monotonic()
        (run,) = await ask([stub.url], 3.0)
        took = time.monotonic() - t0
    assert took < 4.5, took  # today: still reading at the guard's 30 s
    assert run.status is Status.UNKNOWN and run.doc is None
    assert "GET /healthz" in (run.error or "") and "deadline (3.0 s)" in (run.error or ""), run.error
    assert json.loads(json.dumps(cluster_document_of(run)))["nodes"][1]["error"] == run.error


def cluster_document_of(*runs: NodeRun) -> dict[str, Any]:
    from dgxdoctor.fleet.cluster import assemble

    local = NodeRun("dgx-a", None, results_doc("dgx-a"))
    return cluster_document(assemble(local, runs, deadline_s=3.0))


async def test_more_peers_than_parallel_slots_share_the_one_deadline() -> None:
    stubs = [PeerStub(f"dgx-{i}", silent=True) for i in range(MAX_PARALLEL_FETCHES + 2)]
    try:
        t0 = time.monotonic()
        runs = await ask([s.url for s in stubs], 2.0)
        took = time.monotonic() - t0
    finally:
        for s in stubs:
            s.close()
    assert took < 3.2, took  # today 4 s: the two past the slots got a whole deadline of their own
    assert all(r.status is Status.UNKNOWN for r in runs)
    assert sum("POST /check/run" in (r.error or "") for r in runs) == MAX_PARALLEL_FETCHES
    assert sum("not asked" in (r.error or "") for r in runs) == 2


def error_page(conn: socket.socket, stub: PeerStub) -> None:
    size = 100 * 2**20
    conn.sendall(b'HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n{"error": "disk on fire"' % size)
    conn.settimeout(5)
    chunk = b" " * 65536
    for _ in range(size // len(chunk)):
        conn.sendall(chunk)
        stub.sent += len(chunk)


async def test_an_error_page_is_read_to_its_first_bytes_only() -> None:
    counting = Counting()
    with PeerStub("dgx-err", {"/state": error_page}) as stub:
        env = Environment(http_transport=counting)
        async with env.async_http_client(10.0) as client:
            with pytest.raises(BadAnswer, match="HTTP 500"):
                await asyncio.wait_for(read_answer(client, "GET", f"{stub.url}/state", TOKEN), 30)
    assert counting.read < 256 * 2**10, counting.read  # today: 32 MiB read for a 300-character message


def compressed(conn: socket.socket, stub: PeerStub) -> None:
    body = gzip.compress(json.dumps(results_doc(stub.node)).encode())
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


async def test_a_compressed_answer_is_refused() -> None:
    """Decoded, a gzip answer could grow a thousandfold past the byte cap in one chunk."""
    with PeerStub("dgx-gz", {"/state": compressed}) as stub:
        (run,) = await ask([stub.url], 5.0, cached=True)
    assert run.status is Status.UNKNOWN and "Content-Encoding: gzip" in (run.error or ""), run.error


def strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("generated_at", ["1e400", "-1e400", "Infinity", "NaN"])
async def test_a_non_finite_number_from_a_peer_is_absent_and_the_output_json(generated_at: str) -> None:
    doc = json.dumps(results_doc("dgx-inf")).replace('"generated_at":', f'"generated_at": {generated_at}, "x":')
    doc = doc.replace('"samples": []', '"samples": [{"name": "m", "value": 1e999}]')

    def answer(conn: socket.socket, stub: PeerStub) -> None:
        send_json(conn, None, doc.encode())

    with PeerStub("dgx-inf", {"/state": answer}) as stub:
        (run,) = await ask([stub.url], 5.0, cached=True)
    assert run.status is Status.OK and run.doc is not None, run.error
    assert run.doc["generated_at"] is None  # today: inf, printed as Infinity
    assert run.doc["checks"][0]["samples"][0]["value"] is None
    strict(json.dumps(cluster_document_of(run)))


async def test_a_non_finite_required_number_refuses_the_document() -> None:
    doc = json.dumps(results_doc("dgx-inf")).replace('"duration_s":', '"duration_s": Infinity, "x":')

    def answer(conn: socket.socket, stub: PeerStub) -> None:
        send_json(conn, None, doc.encode())

    with PeerStub("dgx-inf", {"/state": answer}) as stub:
        (run,) = await ask([stub.url], 5.0, cached=True)
    assert run.status is Status.UNKNOWN and "duration_s" in (run.error or ""), run.error


def test_the_comparisons_fetch_is_kept_for_the_page() -> None:
    """What ``peer_compare`` fetched, the whole validated document with it, lands in the page's store."""
    states = PeerStates()
    with PeerStub("dgx-b") as good, PeerStub("dgx-c", silent=True) as wedged:
        fetched = fetch_all(lambda: Environment().async_http_client(1.0), [good.url, wedged.url], TOKEN, 1.0)
    states.record(fetched)
    held_good, held_wedged = states.get(good.url), states.get(wedged.url)
    assert held_good is not None and held_good.document is not None
    assert held_good.document.state()["checks"][0]["summary"] == "8 GPUs"  # the page's text, not only the compared
    assert held_wedged is not None and held_wedged.document is None and "timed out" in (held_wedged.error or "")
    assert held_wedged.fetched_at > 0
    states.record(fetched[:1])  # a reload dropped a peer: it leaves the page with the next comparison
    assert states.get(wedged.url) is None


# -- a peer's tar part -------------------------------------------------------------------------------------------


def hostile_part(kind: bytes, claimed: int, following: int) -> bytes:
    """A gzip whose tar opens with a pax (``x``) or GNU long-name (``L``) header claiming ``claimed`` bytes,
    followed by ``following`` zero bytes (a few KiB compressed)."""
    info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "././@PaxHeader")
    info.type = kind
    info.size = claimed
    header = info.tobuf(format=tarfile.GNU_FORMAT)[: tarfile.BLOCKSIZE]
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1) as gz:
        gz.write(header)
        zeros = bytes(2**20)
        for _ in range(following // len(zeros)):
            gz.write(zeros)
    return out.getvalue()


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
@pytest.mark.parametrize("following", [2 * 2**20, 48 * 2**20])
def test_a_tar_header_claiming_a_gibibyte_is_refused_before_it_is_read(kind: bytes, following: int) -> None:
    raw = hostile_part(kind, 2**30, following)
    assert len(raw) < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(BadPart) as refused:
            read_part(raw, 2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, peak  # today: all that follows the header is read into memory as the header
    if following < 4 * 2**20:
        assert "extended header" in str(refused.value) and str(2**30) in str(refused.value)
    else:
        assert "uncompressed" in str(refused.value)


def test_a_part_this_agent_writes_still_reads_back() -> None:
    part = Part("dgx-b", [("results.json", b"{}"), ("logs/kern.log", b"x" * 100_000)], {"node": "dgx-b", "files": []})
    back = read_part(part_bytes(part), 2**20)
    assert back.node == "dgx-b" and dict(back.files) == dict(part.files)

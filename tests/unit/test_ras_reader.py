"""The NCCL RAS reader: the client protocol against a stand-in server on loopback, and the report parsers.

Until the H200 recording exists the stand-in answers with NCCL's own replies and reports composed from its format
strings (tests/fixtures/ras/SOURCES.md).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from dgxdoctor.sources.ras_client import RasError, parse_ras_addr, query
from dgxdoctor.sources.ras_report import RasReportError, parse_report
from ras_standin import CLOSE, scripted

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
HELLO = b"SERVER PROTOCOL 2\n"
OK = b"OK\n"
NO_JSON = b"ERROR: Unknown command SET FORMAT json\n"  # client_support.cc:408 before 2.28.7


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_text_report_through_the_protocol_as_ncclras_sends_it() -> None:
    with scripted([HELLO, OK, NO_JSON, fixture("stall_rank11.txt") + CLOSE]) as server:
        reply = query("127.0.0.1", server.port, deadline_s=5)
    assert server.received == [b"CLIENT PROTOCOL 2\n", b"TIMEOUT 5\n", b"SET FORMAT json\n", b"VERBOSE STATUS\n"]
    assert (reply.format, reply.server_protocol, reply.attempts) == ("text", 2, 1)
    assert reply.report.encode() == fixture("stall_rank11.txt")
    assert [e.received for e in reply.exchanges[:3]] == [HELLO, OK, NO_JSON]


def test_json_report_when_the_server_takes_set_format() -> None:
    with scripted([HELLO, OK, OK, fixture("healthy_2x8.json") + CLOSE]) as server:
        reply = query("127.0.0.1", server.port, verbose=False, collective_timeout_s=2, deadline_s=5)
    assert server.received[1:] == [b"TIMEOUT 2\n", b"SET FORMAT json\n", b"STATUS\n"]
    report = parse_report(reply.report)
    serving = report.serving()
    assert reply.format == "json" and serving is not None
    assert (serving.size, serving.nodes, serving.ranks_per_node) == (16, 2, (8, 8))
    assert {(r.rank, r.host, r.cuda_dev) for r in serving.ranks} >= {(0, "10.0.0.1", 0), (11, "10.0.0.2", 3)}


def test_deadline_when_the_report_never_comes() -> None:
    def silent(conn: socket.socket) -> None:
        time.sleep(3)

    with scripted([HELLO, OK, NO_JSON, silent]) as server:
        started = time.monotonic()
        with pytest.raises(RasError) as err:
            query("127.0.0.1", server.port, deadline_s=0.8)
    assert err.value.kind == "timeout"
    assert time.monotonic() - started < 2.5


def test_handshake_retried_when_the_first_process_does_not_answer() -> None:
    """SO_REUSEPORT: a connection can land on a stopped NCCL process; ncclras retries after 1 s (client.cc:273)."""

    def stopped(conn: socket.socket) -> None:
        time.sleep(1.5)

    calls: list[int] = []

    def handler_factory() -> list[object]:
        return [HELLO, OK, NO_JSON, fixture("healthy_2x8.txt") + CLOSE]

    with scripted([stopped]) as first, scripted(handler_factory()) as second:  # type: ignore[arg-type]

        def connect(addr: tuple[str, int], timeout: float) -> socket.socket:
            calls.append(1)
            port = first.port if len(calls) == 1 else second.port
            return socket.create_connection(("127.0.0.1", port), timeout=timeout)

        reply = query("127.0.0.1", 1, deadline_s=6, connect=connect)
    assert reply.attempts == 2 and reply.format == "text"


def test_short_read_is_a_closed_connection() -> None:
    with scripted([b"SERVER PROT" + CLOSE]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=3)
    assert err.value.kind == "closed"


def test_garbage_is_not_nccl() -> None:
    with scripted([b"HTTP/1.1 400 Bad Request\r\n\r\n" + CLOSE]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=3)
    assert err.value.kind == "protocol" and "not NCCL's RAS" in str(err.value)


@pytest.mark.parametrize("version", ["\u00b2", "", "two", "2.28", "9" * 40])
def test_handshake_without_a_version_number_names_the_line(version: str) -> None:
    """NCCL answers "SERVER PROTOCOL %d"; "\u00b2" passes str.isdigit() and int() refuses it."""
    with scripted([f"SERVER PROTOCOL {version}\n".encode() + CLOSE]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=3)
    assert err.value.kind == "protocol"
    assert f"handshake answered {f'SERVER PROTOCOL {version}'.strip()!r}" in str(err.value)


def test_binary_garbage_without_newline_is_capped() -> None:
    with scripted([b"\xff" * 10000]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=3)
    assert err.value.kind == "protocol"


def test_size_cap() -> None:
    with scripted([HELLO, OK, NO_JSON, b"x" * 200_000 + CLOSE]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=5, max_bytes=100_000)
    assert err.value.kind == "too_large"


def test_timeout_refused_by_the_server() -> None:
    with scripted([HELLO, b"ERROR: Invalid timeout value 5\n"]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=3)
    assert err.value.kind == "protocol" and "Invalid timeout" in str(err.value)


def test_nothing_listening_is_refused() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(RasError) as err:
        query("127.0.0.1", port, deadline_s=3)
    assert err.value.kind == "refused"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:28031", ("127.0.0.1", 28031)), ("[::1]:28028", ("::1", 28028)), ("dgx-a", ("dgx-a", 28028)),
     ("localhost:28028", ("localhost", 28028))],
)  # fmt: skip
def test_ras_addr(value: str, expected: tuple[str, int]) -> None:
    assert parse_ras_addr(value) == expected


@pytest.mark.parametrize("value", ["", "host:0", "host:99999", "host:ab", "[::1"])
def test_bad_ras_addr_named(value: str) -> None:
    with pytest.raises(RasError) as err:
        parse_ras_addr(value)
    assert err.value.kind == "address"


def test_text_healthy_world() -> None:
    report = parse_report(fixture("healthy_2x8.txt").decode())
    assert (report.nccl_version, report.nodes, report.processes, report.gpus) == ("2.28.9", 2, 16, 16)
    serving = report.serving()
    assert serving is not None and (serving.size, serving.nodes, serving.ranks_per_node) == (16, 2, (8, 8))
    assert serving.errors == "OK" and not report.issues


def test_text_stall_names_rank_host_pid_gpu_in_ncclS_words() -> None:
    report = parse_report(fixture("stall_rank11.txt").decode())
    ranks = [i for i in report.issues if i.rank == 11]
    assert [(i.kind, i.host, i.pid, i.gpus) for i in ranks] == [("unresponsive", "10.0.0.2", 48213, (3,))]
    assert "Rank 11 -- GPU 3 managed by process 48213 on node 10.0.0.2" in ranks[0].evidence
    assert "Missing communicator data from 1 rank" in ranks[0].evidence
    assert report.timeouts == 1


def test_text_dead_and_behind() -> None:
    report = parse_report(fixture("dead_rank11.txt").decode())
    kinds = {(i.kind, i.rank, i.pid) for i in report.issues}
    assert ("dead", None, 48213) in kinds and ("behind", 4, 51007) in kinds
    dead = next(i for i in report.issues if i.kind == "dead")
    assert "considered dead (unreachable via the RAS network)" in dead.evidence


def test_text_v2_24_missing_rank_list() -> None:
    report = parse_report(fixture("stall_rank11_v2.24.txt").decode())
    assert report.collection_s == 5.01
    assert any(i.kind == "unresponsive" and i.rank == 11 for i in report.issues)


@pytest.mark.parametrize("name", ["stall_rank11.json", "stall_rank11_v2.30.json"])
def test_json_stall_including_the_2_28_missing_comma(name: str) -> None:
    report = parse_report(fixture(name).decode())
    issue = next(i for i in report.issues if i.rank == 11)
    assert (issue.kind, issue.host, issue.pid, issue.gpus, issue.nvml_gpus) == (
        "unresponsive", "10.0.0.2", 48213, (3,), (3,)
    )  # fmt: skip
    assert report.timeouts == 1


@pytest.mark.parametrize(
    "text",
    ["", "hello\n", '{"communicators": 3}', "{not json", "{" * 5000,
     "Errors\n======\n\nDEAD\n  Process " + "7" * 5000 + " on node 10.0.0.2 managing GPU 3\n"],
)  # fmt: skip
def test_not_a_report_named(text: str) -> None:
    with pytest.raises(RasReportError):
        parse_report(text)

"""The reader against NCCL's recorded bytes: a stand-in server on loopback replays every session that
scripts/h200-ras.sh recorded on the H200 machine (docs/h200/**/*sessions.json, first
docs/h200/ras-2026-12-01: NCCL 2.28.9, a one-rank job), byte for byte, and NCCL's own ncclras as recorded through
the proxy.

Until a recording is committed there is nothing to replay and these tests are skipped; the protocol is covered
meanwhile by test_ras_reader.py with replies from NCCL's format strings.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from dgxdoctor.sources.ras_client import RasError, query
from dgxdoctor.sources.ras_report import RasReportError, parse_report
from ras_standin import CLOSE, replay, replay_steps, scripted

H200 = Path(__file__).resolve().parents[2] / "docs" / "h200"
RECORDINGS = sorted(p for p in H200.glob("**/*sessions.json") if "proxy" not in p.name)


def sessions() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in RECORDINGS:
        for name, session in json.loads(path.read_text()).items():
            out.append((f"{path.parent.name}/{name}", session))
    return out


RECORDED = sessions()
# (session, how the reader is asked so that it sends exactly that session's commands)
ASKED = {"json": {"verbose": True, "want_json": True}, "verbose": {"verbose": True, "want_json": False},
         "status": {"verbose": False, "want_json": False}}  # fmt: skip
REPLAYABLE = [(label, s) for label, s in RECORDED if label.rsplit("/", 1)[1] in ASKED]


def replies(session: dict[str, Any]) -> dict[bytes, bytes]:
    return {sent: b"".join(chunks) for sent, chunks, _ in replay_steps(session)}


@pytest.mark.skipif(not RECORDED, reason="no RAS recording committed yet under docs/h200/ (scripts/h200-ras.sh)")
@pytest.mark.parametrize(("label", "session"), REPLAYABLE, ids=[label for label, _ in REPLAYABLE])
def test_recorded_report_replayed_and_parsed(label: str, session: dict[str, Any]) -> None:
    asked = ASKED[label.rsplit("/", 1)[1]]
    with replay(session) as server:
        reply = query("127.0.0.1", server.port, collective_timeout_s=5, deadline_s=20, **asked)
    sent = [e.sent for e in reply.exchanges]
    assert sent == [s for s, _, _ in replay_steps(session)], "the reader must send what NCCL's client sends"
    report = parse_report(reply.report)
    serving = report.serving()
    assert report.nccl_version and serving is not None and serving.size >= 1
    if reply.format == "json":
        assert serving.ranks and all(r.pid > 0 for r in serving.ranks)


@pytest.mark.skipif(not RECORDED, reason="no RAS recording committed yet under docs/h200/ (scripts/h200-ras.sh)")
def test_recorded_json_cut_short_is_unreadable() -> None:
    _, session = next((x for x in RECORDED if x[0].endswith("/json")), RECORDED[0])
    report = replies(session).get(b"VERBOSE STATUS\n", b"")
    hello = replies(session)[b"CLIENT PROTOCOL 2\n"]
    with scripted([hello, b"OK\n", b"OK\n", report[: len(report) // 2] + CLOSE]) as server:
        reply = query("127.0.0.1", server.port, deadline_s=10)
    with pytest.raises(RasReportError):
        parse_report(reply.report)


@pytest.mark.skipif(not RECORDED, reason="no RAS recording committed yet under docs/h200/ (scripts/h200-ras.sh)")
def test_recorded_error_replies() -> None:
    errors = next((s for label, s in RECORDED if label.endswith("/errors")), None)
    assert errors is not None
    got = replies(errors)
    refused = got[b"TIMEOUT -1\n"]
    assert refused.startswith(b"ERROR: ")
    with scripted([got[b"CLIENT PROTOCOL 99\n"], refused]) as server, pytest.raises(RasError) as err:
        query("127.0.0.1", server.port, deadline_s=5)
    assert err.value.kind == "protocol"


PROXIED = sorted(H200.glob("**/proxy-sessions.json"))
NCCLRAS = [(f"{p.parent.parent.name}/{name}", s) for p in PROXIED for name, s in json.loads(p.read_text()).items()]


@pytest.mark.skipif(not NCCLRAS, reason="no recording of NCCL's own ncclras committed yet")
@pytest.mark.parametrize(("label", "session"), NCCLRAS, ids=[label for label, _ in NCCLRAS])
def test_reader_sends_what_ncclras_sent(label: str, session: dict[str, Any]) -> None:
    """NCCL's own client, recorded through the proxy: ncclras (STATUS) and ncclras -v (VERBOSE STATUS), no -t."""
    steps = replay_steps(session)
    verbose = steps[-1][0] == b"VERBOSE STATUS\n"
    with replay(session) as server:
        reply = query("127.0.0.1", server.port, verbose=verbose, want_json=False, collective_timeout_s=None)
    assert [e.sent for e in reply.exchanges] == [s for s, _, _ in steps]
    assert reply.report.encode() == b"".join(steps[-1][1])
    serving = parse_report(reply.report).serving()
    assert serving is not None and (serving.size, serving.nodes, serving.status, serving.errors) == (
        1, 1, "RUNNING", "OK"
    )  # fmt: skip


def test_replay_steps_read_the_recorder_format() -> None:
    """The recorder's JSON (scripts/h200_ras/record.py) as the stand-in reads it."""
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    session = {"events": [{"t": 0, "dir": "sent", "data": b64(b"CLIENT PROTOCOL 2\n")},
                          {"t": 0.001, "dir": "recv", "data": b64(b"SERVER PROTOCOL 2\n")},
                          {"t": 0.002, "dir": "sent", "data": b64(b"STATUS\n")},
                          {"t": 0.01, "dir": "recv", "data": b64(b"NCCL")}, {"t": 0.02, "event": "eof"}]}  # fmt: skip
    assert replay_steps(session) == [(b"CLIENT PROTOCOL 2\n", [b"SERVER PROTOCOL 2\n"], False),
                                     (b"STATUS\n", [b"NCCL"], True)]  # fmt: skip

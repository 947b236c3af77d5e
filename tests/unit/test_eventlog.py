"""Event lines: the daemon's through structlog (JSON objects for journald, its console rendering on a terminal) and
the commands' readable lines from the standard library, with the keys the daemon's log has always had (journald
readers and the tests that parse the daemon's log keep working)."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import re
import subprocess
import sys

from conftest import REPO
from dgxdoctor import eventlog
from dgxdoctor.daemon import logconfig

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_daemon_lines_are_json_objects_with_level_and_utc_time() -> None:
    out = io.StringIO()
    logconfig.configure("info", stream=out)  # not a terminal: JSON
    try:
        log = eventlog.get_logger("t")
        log.debug("not_shown")
        log.warning("check_hung", check="xid", timeout_s=10.0, findings=["XID_79:0000:18:00.0"], path=None)
        try:
            raise ValueError("bad value")
        except ValueError:
            log.exception("job_failed", job="w")
    finally:
        logconfig.configure_commands("critical")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert list(first) == ["check", "timeout_s", "findings", "path", "event", "level", "timestamp"]
    assert first["event"] == "check_hung" and first["level"] == "warning" and ISO_UTC.match(first["timestamp"])
    assert second["level"] == "error" and "ValueError: bad value" in second["exception"]
    assert "exc_info" not in second


def test_daemon_on_a_terminal_renders_for_people_with_the_same_keys() -> None:
    """``dgxdoctor run`` by hand: structlog's console lines; under systemd (stdout the journal) JSON."""
    code = (
        "from dgxdoctor import eventlog\n"
        "from dgxdoctor.daemon import logconfig\n"
        "logconfig.configure('info')\n"
        "eventlog.get_logger('t').warning('check_hung', check='xid', timeout_s=10.0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("JOURNAL_STREAM", None)
    primary, secondary = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", code], stdout=secondary, stderr=subprocess.DEVNULL, env=env, timeout=60)
        text = os.read(primary, 65536).decode()
    finally:
        os.close(primary)
        os.close(secondary)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # colours off
    line = next(x for x in plain.splitlines() if "check_hung" in x)
    assert not line.lstrip().startswith("{")
    stamp, rest = line.split(" ", 1)
    assert ISO_UTC.match(stamp) and "[warning  ]" in rest and "check=xid" in rest and "timeout_s=10.0" in rest


def test_journal_stream_names_the_journal_not_a_terminal() -> None:
    primary, secondary = pty.openpty()
    try:
        with os.fdopen(os.dup(secondary), "w") as tty:
            st = os.fstat(tty.fileno())
            assert logconfig.writes_json(tty, {}) is False
            assert logconfig.writes_json(tty, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}) is True
            assert logconfig.writes_json(tty, {"JOURNAL_STREAM": "8:12345"}) is False  # inherited, names another
    finally:
        os.close(primary)
        os.close(secondary)
    r, w = os.pipe()
    with os.fdopen(r) as reader, os.fdopen(w, "w") as pipe:
        assert logconfig.writes_json(pipe, {}) is True and reader.readable()


def test_command_lines_are_readable_on_stderr() -> None:
    err = io.StringIO()
    eventlog.configure("warning", stream=err)
    log = eventlog.get_logger("t")
    log.info("not_shown")
    log.warning("check_hung", timeout_s=10.0, check="xid", summary="a b")
    assert err.getvalue() == f"[warning  ] {'check_hung':<30} check=xid summary='a b' timeout_s=10.0\n"


def test_library_records_share_the_json_shape() -> None:
    out = io.StringIO()
    logconfig.configure("info", stream=out)
    try:
        logging.getLogger("httpx").warning("retry %s", "x")
        logging.getLogger("apscheduler.executors.default").info("Running job")  # one line per run: left out
    finally:
        logconfig.configure_commands("critical")
    (doc,) = (json.loads(line) for line in out.getvalue().splitlines())
    assert list(doc) == ["event", "logger", "level", "timestamp"] and doc["event"] == "retry x"
    assert doc["logger"] == "httpx" and doc["level"] == "warning" and ISO_UTC.match(doc["timestamp"])


def test_capture_sees_every_event_unrendered() -> None:
    logconfig.configure_commands("critical")
    with eventlog.capture_logs() as logs:
        eventlog.get_logger("t").info("reloaded", changed=["+xid"])
    assert logs == [{"changed": ["+xid"], "event": "reloaded", "log_level": "info"}]


def test_a_closed_stream_loses_the_line_not_the_caller() -> None:
    """structlog's (the daemon's) and the standard library's lines alike: the write to a closed pipe is tried and
    fails, the caller goes on, and the next stream that works gets the next line."""
    tried: list[str] = []

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            tried.append(text)
            raise BrokenPipeError(32, "Broken pipe")

    after: list[str] = []
    for configure in (logconfig.configure, eventlog.configure):
        tried.clear()
        configure("info", stream=Gone())
        try:
            eventlog.get_logger("t").info("signal", signal="SIGTERM")  # the stop goes on
            after.append("returned")
            assert tried and "signal" in "".join(tried)  # the line reached the stream, and was lost there
            out = io.StringIO()
            configure("info", stream=out)
            eventlog.get_logger("t").info("stopped")
            assert "stopped" in out.getvalue()
        finally:
            logconfig.configure_commands("critical")
    assert after == ["returned", "returned"]

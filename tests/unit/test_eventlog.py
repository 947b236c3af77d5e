"""Event lines (dgxdoctor.eventlog): the daemon's JSON objects and the commands' readable lines, as structlog wrote
them before (journald readers and the tests that parse the daemon's log keep working)."""

from __future__ import annotations

import io
import json
import logging
import re

from dgxdoctor import eventlog
from dgxdoctor.daemon import logconfig

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_daemon_lines_are_json_objects_with_level_and_utc_time() -> None:
    out = io.StringIO()
    eventlog.configure("info", json_lines=True, stream=out)
    log = eventlog.get_logger("t")
    log.debug("not_shown")
    log.warning("check_hung", check="xid", timeout_s=10.0, findings=["XID_79:0000:18:00.0"], path=None)
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("job_failed", job="w")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert list(first) == ["check", "timeout_s", "findings", "path", "event", "level", "timestamp"]
    assert first["event"] == "check_hung" and first["level"] == "warning" and ISO_UTC.match(first["timestamp"])
    assert second["level"] == "error" and "ValueError: bad value" in second["exception"]
    assert "exc_info" not in second


def test_command_lines_are_readable_on_stderr() -> None:
    err = io.StringIO()
    eventlog.configure("warning", json_lines=False, stream=err)
    log = eventlog.get_logger("t")
    log.info("not_shown")
    log.warning("check_hung", timeout_s=10.0, check="xid", summary="a b")
    assert err.getvalue() == f"[warning  ] {'check_hung':<30} check=xid summary='a b' timeout_s=10.0\n"


def test_library_records_share_the_json_shape() -> None:
    record = logging.LogRecord("httpx", logging.WARNING, __file__, 1, "retry %s", ("x",), None)
    doc = json.loads(eventlog.JsonFormatter().format(record))
    assert list(doc) == ["event", "logger", "level", "timestamp"] and doc["event"] == "retry x"


def test_capture_sees_every_event_unrendered() -> None:
    logconfig.configure_commands("critical")
    with eventlog.capture_logs() as logs:
        eventlog.get_logger("t").info("reloaded", changed=["+xid"])
    assert logs == [{"changed": ["+xid"], "event": "reloaded", "log_level": "info"}]


def test_a_closed_stream_loses_the_line_not_the_caller() -> None:
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    eventlog.configure("info", json_lines=True, stream=Gone())
    eventlog.get_logger("t").info("signal", signal="SIGTERM")  # the stop goes on
    logconfig.configure_commands("critical")

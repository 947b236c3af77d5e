"""Event logging (``dgxdoctor.eventlog``) configured for the daemon and for every other command.

The daemon (``configure``) logs through structlog on stdout: one JSON object per line where journald or a pipe
reads it (stdout not a terminal, or the journal stream systemd names in ``JOURNAL_STREAM``), structlog's console
rendering on a terminal; the keys are the same either way (``event``, ``level``, ``timestamp`` in UTC, then the
event's fields). structlog is imported here, when the daemon configures its log, and by nothing a one-shot command
loads. Every other command (``configure_commands``) writes readable lines on stderr through the standard library.

Libraries that log through the standard ``logging`` module (httpx, httpcore, APScheduler) go through the same
structlog renderer, with a ``logger`` key naming the library.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from dgxdoctor import eventlog

# ISO 8601 in UTC with microseconds, always six digits: 2026-12-01T19:44:59.150902Z.
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def configure_commands(level: str = "warning") -> None:
    """Every command but the daemon: diagnostics as readable lines on stderr, never on stdout.

    stdout holds only the command's document (``check --json``, ``diagnose --json``, rules): a Nagios or cron
    wrapper parses it, and a warning such as a check whose run hung must not break it.
    """
    numeric = getattr(logging, level.upper(), logging.WARNING)
    eventlog.configure(level, stream=sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)


def writes_json(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """JSON lines unless ``stream`` is a terminal that is not the journal (systemd.exec(5): ``JOURNAL_STREAM``
    is ``DEVICE:INODE`` of the stream connected to the journal; a shell may inherit it for a terminal)."""
    env = os.environ if environ is None else environ
    try:
        fd = stream.fileno()
        if not os.isatty(fd):
            return True
        st = os.fstat(fd)
    except (OSError, ValueError, AttributeError):  # no descriptor (a StringIO): not a terminal
        return True
    return env.get("JOURNAL_STREAM", "") == f"{st.st_dev}:{st.st_ino}"


def configure(level: str = "info", *, stream: TextIO | None = None, json_lines: bool | None = None) -> None:
    """The daemon's log: structlog's lines on ``stream`` (stdout), at ``level`` and above.

    ``json_lines`` None chooses by the stream (``writes_json``)."""
    import structlog

    out = sys.stdout if stream is None else stream
    as_json = writes_json(out) if json_lines is None else json_lines
    numeric = getattr(logging, level.upper(), logging.INFO)
    stamp = structlog.processors.TimeStamper(fmt=TIMESTAMP_FORMAT, utc=True, key="timestamp")
    renderer: Any
    if as_json:
        tail: list[Any] = [structlog.processors.format_exc_info]
        renderer = structlog.processors.JSONRenderer(default=repr)
    else:
        tail = []
        renderer = structlog.dev.ConsoleRenderer(colors=_is_terminal(out))
    structlog.configure(
        processors=[structlog.processors.add_log_level, stamp, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    bound = structlog.get_logger().bind()

    def sink(method: str, event: str, fields: dict[str, Any]) -> None:
        getattr(bound, method)(event, **fields)

    eventlog.use(sink)
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.stdlib.add_log_level, stamp, *tail],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    # httpx logs every request at INFO: a line per vLLM, Ray and peer call, many a minute, none of them news.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    # APScheduler logs each run at INFO and, at WARNING, each fire skipped because the check's run is still going
    # (max_instances=1: a slow check is the check's news, its duration and timeout are exported) or a run missed
    # by over its grace; a failing job is logged as job_failed by the scheduler's own guard.
    logging.getLogger("apscheduler").setLevel(max(numeric, logging.ERROR))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False

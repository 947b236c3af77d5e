"""Event logging (``dgxdoctor.eventlog``) configured for the daemon (one JSON object per line on stdout, which
journald keeps) and for every other command (readable lines on stderr, so that stdout holds only the command's
output).

Libraries that log through the standard ``logging`` module (httpx, httpcore) go through the same JSON renderer.
"""

from __future__ import annotations

import logging
import sys

from dgxdoctor import eventlog


def configure_commands(level: str = "warning") -> None:
    """Every command but the daemon: diagnostics as readable lines on stderr, never on stdout.

    stdout holds only the command's document (``check --json``, ``diagnose --json``, rules): a Nagios or cron
    wrapper parses it, and a warning such as a check whose run hung must not break it.
    """
    numeric = getattr(logging, level.upper(), logging.WARNING)
    eventlog.configure(level, json_lines=False, stream=sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)


def configure(level: str = "info") -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    eventlog.configure(level, json_lines=True, stream=sys.stdout)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(eventlog.JsonFormatter())
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

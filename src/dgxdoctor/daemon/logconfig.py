"""structlog configured for the daemon (one JSON object per line on stdout, which journald keeps) and for every
other command (readable lines on stderr, so that stdout holds only the command's output).

Libraries that log through the standard ``logging`` module (httpx, httpcore) go through the same JSON renderer.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_commands(level: str = "warning") -> None:
    """Every command but the daemon: diagnostics as readable lines on stderr, never on stdout.

    stdout holds only the command's document (``check --json``, ``diagnose --json``, rules): a Nagios or cron
    wrapper parses it, and a warning such as a check whose run hung must not break it. structlog's default
    logger writes to stdout, so it is replaced before any command runs.
    """
    numeric = getattr(logging, level.upper(), logging.WARNING)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)


def configure(level: str = "info") -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    shared: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *shared,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    # httpx logs every request at INFO: a line per vLLM, Ray and peer call, many a minute, none of them news.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))

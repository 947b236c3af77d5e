"""Verdicts on the log files the logs check follows (what the lines in them mean is ``judge.signatures``)."""

from __future__ import annotations

from dgxdoctor.result import Finding, Status


def log_unreadable(error: str) -> Finding:
    """A configured log that cannot be read (permissions, a vanished mount): a WARNING, since the failures it
    would show go unseen while the other logs are still read. ``error`` is "<path>: <reason>"."""
    return Finding("LOG_UNREADABLE", Status.WARNING, f"cannot read log file: {error}", error.split(":", 1)[0])

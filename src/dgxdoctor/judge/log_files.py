"""Verdicts on the log files the logs check follows (what the lines in them mean is ``judge.signatures``)."""

from __future__ import annotations

from dgxdoctor.result import Finding, Status


def log_unreadable(error: str) -> Finding:
    """A configured log that cannot be read (permissions, a vanished mount): a WARNING, since the failures it
    would show go unseen while the other logs are still read. ``error`` is "<path>: <reason>"."""
    return Finding("LOG_UNREADABLE", Status.WARNING, f"cannot read log file: {error}", error.split(":", 1)[0])


def log_backlog(unread: int, limit: int, *, one_shot: bool) -> Finding:
    """More to read than the per-run limit: never OK, since a failure in the unread bytes is not reported. The
    daemon reads them on its next runs; the one-shot ``check`` does not read them at all."""
    if one_shot:
        message = f"{unread} bytes of the recent past were not read (per-run limit {limit} bytes)"
        remedy = "raise [checks.logs] max_bytes_per_run, or read the file with dgxdoctor diagnose FILE"
    else:
        message = f"read the per-run limit of {limit} bytes; {unread} bytes are not read yet (the next runs read them)"
        remedy = "raise [checks.logs] max_bytes_per_run if the logs grow faster than it per interval"
    return Finding("LOG_BACKLOG", Status.WARNING, message + ": a failure in them is not reported yet", remedy=remedy)


def journal_unreadable(units: list[str], reason: str) -> Finding:
    """The journal of the configured units cannot be read (no journalctl, a journal directory that is not there, no
    permission): UNKNOWN, never OK, since what those units log (vLLM's engine, Ray) goes unseen. A unit with no
    entries is no such case: its read is empty."""
    return Finding(
        "JOURNAL_UNREADABLE",
        Status.UNKNOWN,
        f"cannot read the journal of {', '.join(units)}: {reason}; a failure logged there is not seen",
        "journal",
        remedy="install systemd's journalctl and run the agent as root (or in the systemd-journal group); where these "
        "units do not log to this journal, set [checks.logs] journal_units (or journal_directory)",
    )


def journal_backlog(max_lines: int, max_chars: int, *, one_shot: bool) -> Finding:
    """More journal entries than one run reads: never OK, as for files (``log_backlog``)."""
    limits = f"{max_lines} entries or {max_chars} bytes of journalctl's output"
    if one_shot:
        message = f"the journal holds more of the recent past than the per-run limit ({limits}): older entries not read"
        remedy = "raise [checks.logs] journal_max_lines / max_bytes_per_run, or read journalctl -u UNIT"
    else:
        message = f"read the per-run limit of the journal ({limits}); the next runs read the rest"
        remedy = (
            "raise [checks.logs] journal_max_lines / max_bytes_per_run if the units log faster than it per interval"
        )
    return Finding(
        "LOG_BACKLOG", Status.WARNING, message + ": a failure in them is not reported yet", "journal", remedy=remedy
    )


def container_log_unreadable(container: str, reason: str) -> Finding:
    """The log of vLLM's container (``[node] container``) cannot be read (no runtime, no daemon, no such container,
    a log driver that keeps nothing to read back): UNKNOWN, never OK, since vLLM's lines go unseen."""
    return Finding(
        "CONTAINER_LOG_UNREADABLE",
        Status.UNKNOWN,
        f"cannot read the log of container {container}: {reason}; a failure logged there is not seen",
        f"container:{container}",
        remedy="check that the container runs (docker ps -a) and that its log driver keeps a log to read back "
        "(json-file, local or journald: docker logs NAME); run the agent as root or in the docker group",
    )


def container_log_backlog(container: str, max_lines: int, *, one_shot: bool) -> Finding:
    """More new lines in the container's log than one run reads: the newest are read, the older ones not (the
    runtime gives a log's tail, not a cursor): never OK."""
    when = "of the recent past" if one_shot else "since the last run"
    return Finding(
        "LOG_BACKLOG",
        Status.WARNING,
        f"container {container} logged more lines {when} than the per-run limit ({max_lines} lines): only the newest "
        "were read, a failure in the older ones is not reported",
        f"container:{container}",
        remedy="raise [checks.logs] journal_max_lines / max_bytes_per_run, or read docker logs NAME",
    )

"""Lines written through a real systemd journal: ``systemd-journal-remote`` (Debian package of that name) turns
journal export-format input into journal files that ``journalctl --directory`` reads, with no systemd as PID 1.

Each call appends to ``<directory>/remote.journal`` (or the file named): one entry per (unit, message), stamped now
(so inside the logs check's window), with the fields journald gives a service's stdout line.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"


def journal_remote() -> str:
    """The tool's path, or the test is skipped saying which package brings it (scripts/install-system-deps)."""
    found = shutil.which(JOURNAL_REMOTE) or shutil.which("systemd-journal-remote")
    if found is None:
        pytest.skip("systemd-journal-remote not installed (Debian package systemd-journal-remote)")
    return found


def write_journal(
    directory: Path, entries: Sequence[tuple[str, str]], *, pid: int = 4242, file: str = "remote", ident: str = "vllm"
) -> None:
    """Append ``(unit, message)`` entries (single-line messages) to the journal in ``directory`` (its file
    ``<file>.journal``: one writer per file; journalctl reads every file of the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time_ns() // 1000
    export = "".join(
        f"__REALTIME_TIMESTAMP={now + i}\n_SYSTEMD_UNIT={unit}\n_PID={pid}\n_TRANSPORT=stdout\n"
        f"SYSLOG_IDENTIFIER={ident}\nPRIORITY=6\nMESSAGE={message}\n\n"
        for i, (unit, message) in enumerate(entries)
    )
    subprocess.run(
        [journal_remote(), f"--output={directory / f'{file}.journal'}", "-"],
        input=export.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    )

"""``[bundle]``: limits of one evidence archive (``dgxdoctor bundle`` and the capture before a restart)."""

from __future__ import annotations

from pydantic import Field

from dgxdoctor.settings.base import Frozen
from dgxdoctor.sources.fields import ByteCount


class BundleSettings(Frozen):
    """``dgxdoctor bundle`` and the capture before a restart: limits of one evidence archive."""

    size_cap_bytes: ByteCount = Field(
        64 * 2**20,
        ge=2**16,
        description="bytes (or a size: 64M) of all files of one node's part; past it files are cut, and it says so",
    )
    deadline_s: float = Field(120.0, gt=0, le=3600, description="`dgxdoctor bundle`: the whole collection's deadline")
    command_timeout_s: float = Field(20.0, gt=0, description="each command of a bundle (nvidia-smi -q, ray status)")
    bug_report_timeout_s: float = Field(
        60.0, gt=0, description="nvidia-bug-report.sh --safe-mode, when installed (bundle only, never the capture)"
    )
    since_s: float = Field(3600.0, gt=0, description="the default window of kernel and service logs (--since)")
    capture_before_restart: bool = Field(True, description="act mode: capture a bundle before every restart")
    capture_deadline_s: float = Field(
        5.0, gt=0, le=60, description="the capture before a restart never delays it longer than this"
    )
    capture_since_s: float = Field(900.0, gt=0, description="the window of logs in a capture before a restart")
    keep: int = Field(10, ge=1, le=1000, description="captures kept in <state_dir>/bundles (the oldest go first)")

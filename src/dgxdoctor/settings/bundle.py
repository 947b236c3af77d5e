"""``[bundle]``: limits of one evidence archive (``dgxdoctor bundle`` and the capture before a restart)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bounds import HOUR_S, WEEK_S
from dgxdoctor.validation import ByteCount


class PartBytes(ByteCount):
    """One node's part of a bundle: 64K .. 16G."""

    low = 2**16
    high = 16 << 30


class BundleSettings(Frozen, frozen=True):
    """``dgxdoctor bundle`` and the capture before a restart: limits of one evidence archive."""

    size_cap_bytes: Annotated[
        PartBytes,
        Meta(
            description="bytes (or a size: 64M) of all files of one node's part; past it files are cut, and it says so"
        ),
    ] = PartBytes(64 * 2**20)
    deadline_s: Annotated[
        float, Meta(gt=0, le=3600, description="`dgxdoctor bundle`: the whole collection's deadline")
    ] = 120.0
    command_timeout_s: Annotated[
        float, Meta(gt=0, le=HOUR_S, description="each command of a bundle (nvidia-smi -q, ray status)")
    ] = 20.0
    bug_report_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=HOUR_S,
            description="nvidia-bug-report.sh --safe-mode, when installed (bundle only, never the capture)",
        ),
    ] = 60.0
    since_s: Annotated[
        float, Meta(gt=0, le=WEEK_S, description="the default window of kernel and service logs (--since)")
    ] = 3600.0
    capture_before_restart: Annotated[bool, Meta(description="act mode: capture a bundle before every restart")] = True
    capture_deadline_s: Annotated[
        float, Meta(gt=0, le=60, description="the capture before a restart never delays it longer than this")
    ] = 5.0
    capture_since_s: Annotated[
        float, Meta(gt=0, le=WEEK_S, description="the window of logs in a capture before a restart")
    ] = 900.0
    keep: Annotated[
        int, Meta(ge=1, le=1000, description="captures kept in <state_dir>/bundles (the oldest go first)")
    ] = 10

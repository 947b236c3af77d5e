"""Lines that look like a plain failure and are none: kernel records a healthy GPU node logs at ``err`` priority
(judge/uncatalogued.py reads a kernel record at err or above as a failure nobody catalogued). Each entry says why it
is benign and where it was seen; a line is benign only when an entry's pattern matches its message.

The uncatalogued pass stays whole: an entry names one message, never a family or a level.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.lazy_re import LazyPattern, lazy_compile


class Benign(Struct, frozen=True):
    name: str
    pattern: LazyPattern
    reason: str
    seen: str


KNOWN_BENIGN: tuple[Benign, ...] = (
    Benign(
        "nvrm_loading_banner",
        # 3,355,437110,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)
        # [    3.45] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023
        lazy_compile(r"\bNVRM: loading NVIDIA UNIX (?:Open Kernel Module for \w{1,16}|\w{1,16} Kernel Module)\b"),
        "the driver's banner as its module loads: nv.c prints it with NV_DBG_ERRORS so that it always shows, and "
        "the 580 drivers log it at err priority (3) on every healthy boot",
        "tests/fixtures/kernel_log/kmsg_records_h200_580.txt (the H200 test machine's /dev/kmsg, driver 580.159.04); "
        "lookalikes.txt (driver 570.158.01)",
    ),
)


def known_benign(line: str) -> Benign | None:
    """The entry that names ``line`` as benign, or None."""
    if "NVRM: loading" not in line:  # the only entries' common words: most lines cost one substring test
        return None
    return next((entry for entry in KNOWN_BENIGN if entry.pattern.search(line) is not None), None)

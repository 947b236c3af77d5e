"""Give back what start-up used and no longer needs: the daemon lives for months, so memory that importing and
compiling modules (and the first round of checks) freed but glibc still holds would otherwise stay resident."""

from __future__ import annotations

import ctypes
import gc

# After the first round of checks: FIRST_RUN_SPREAD_S plus the slowest default check's first run.
SETTLE_S = 15.0
# Then now and again, for what a check run's thread freed into a malloc arena (a few ms of CPU each time).
TRIM_EVERY_S = 600.0


def release_freed_memory(freeze: bool) -> bool:
    """Collect cyclic garbage, optionally freeze what survives, and return freed heap pages to the kernel.

    ``gc.freeze()`` moves every object that survived start-up (modules, settings models, the catalog) out of the
    collector's generations, so later collections never walk them again. Returns whether ``malloc_trim`` ran
    (False off glibc).
    """
    gc.collect()
    if freeze:
        gc.freeze()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True

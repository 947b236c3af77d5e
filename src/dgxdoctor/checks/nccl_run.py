"""One probe run's raw outcome, shared by the nccl check and its cross-node driver (``checks.nccl_cross``)."""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.validation import ByteSize

# The bundled probe's exit status when a node did not join in time (``probes.allreduce.EX_PEER_MISSING``).
EX_PEER_MISSING = 4
# Every size in 1 B .. 16 GiB (nccl-tests' customary -e is 8G): "0" would never end the doubling loop.
MAX_PROBE_BYTES = 16 << 30


class ProbeSize(ByteSize):
    """A probe's message size, 1 B .. 16 GiB: in the config ([checks.nccl] min_bytes/max_bytes) and in a peer's
    join request alike."""

    low = 1
    high = MAX_PROBE_BYTES


# The bundled probe's message sizes unless configured (its own stdlib copy, ``probes.allreduce``, is held equal by
# tests/unit/test_settings_types.py).
DEFAULT_MIN_BYTES = ProbeSize("8M")
DEFAULT_MAX_BYTES = ProbeSize("1G")


class ProbeRun(Struct, frozen=True):
    """One probe's raw outcome on this node, and the peer's when the run spanned two nodes."""

    returncode: int
    stdout: str
    stderr: str
    rail: str | None = None
    peer: ProbeRun | None = None
    peer_error: str | None = None
    # The peer's own answer to "has this node IB/RoCE devices" (its sysfs), for its transport verdict.
    has_ib: bool = False

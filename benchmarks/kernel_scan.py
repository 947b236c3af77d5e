"""Cost of reading kernel faults beyond XIDs on every followed kernel log line, beside the XID scanner alone.

Usage: ``PYTHONPATH=src .venv/bin/python benchmarks/kernel_scan.py [LINES]``. A synthetic kernel log of ordinary
boot and runtime lines with one fault line in 200 (tests/fixtures/kernel_log/faults_beyond_xid.txt, cycled) is fed
through ``KernelLogScanner`` (XIDs) and through ``parse_kernel_event`` (the rest); prints lines per second of
each and the ratio.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dgxdoctor.sources.kernel_events import parse_kernel_event
from dgxdoctor.sources.xid import KernelLogScanner

FAULTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "kernel_log" / "faults_beyond_xid.txt"
ORDINARY = (
    "IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f0: link becomes ready",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    'audit: type=1400 audit(1764590580.123:42): apparmor="STATUS" operation="profile_load"',
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build",
    "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    "systemd[1]: Started session-42.scope - Session 42 of User root.",
)


def lines(count: int) -> list[str]:
    faults = [line for line in FAULTS.read_text().splitlines() if line]
    return [faults[i // 200 % len(faults)] if i % 200 == 0 else ORDINARY[i % len(ORDINARY)] for i in range(count)]


def rate(fn: object, data: list[str]) -> float:
    t0 = time.perf_counter()
    for line in data:
        fn(line)  # type: ignore[operator]
    return len(data) / (time.perf_counter() - t0)


def main() -> None:
    data = lines(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
    xid = rate(KernelLogScanner().feed, data)
    kernel = rate(parse_kernel_event, data)
    print(f"{len(data)} lines: XID scanner {xid:,.0f} lines/s; kernel faults {kernel:,.0f} lines/s; "
          f"kernel/XID time ratio {xid / kernel:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

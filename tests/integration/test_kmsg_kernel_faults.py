"""Real lines of every kernel fault kind beyond XIDs, written into the real /dev/kmsg, reach the daemon's /metrics
within a second, counted against the device each names.

The daemon (``python -m dgxdoctor run``, only the xid check enabled) follows /dev/kmsg and reads a PCI tree laid out
from tests/fixtures/pci/dgx_h100.txt. Lines and tree get a random PCI domain, so the GPUs and PCI addresses are new
to every run; counts are compared with those the daemon showed before the writes (the ring buffer keeps earlier
runs' lines until reboot: these lines stay too, see docs/checks/xid.md). One descriptor per line: the kernel
rate-limits each writer to 10 lines per 5 s.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_process import free_port

from conftest import REPO
from dgxdoctor.checks.registry import ALL_CHECKS
from pcitree import PCI_FIXTURES, add_pci_device

pytestmark = pytest.mark.integration

KMSG = Path("/dev/kmsg")
FAULTS = REPO / "tests" / "fixtures" / "kernel_log" / "faults_beyond_xid.txt"
# A dmesg stamp or a syslog "host kernel:" header: what the kernel does not write into a record.
PREFIX_RE = re.compile(r"^(?:[A-Z][a-z]{2} +\d+ [\d:]{8} (?:\S+ )?kernel: )?(?:\[[^\]]*\] )?")
EXPECTED_LABELS = {  # kind -> device label on the tree (DOMAIN is the run's random PCI domain)
    "link_down": "mlx5_0", "module_event": "mlx5_2", "mlx5_cmd_timeout": "mlx5_3", "mlx5_health": "mlx5_4",
    "mlx5_fatal": "mlx5_5", "aer_corrected": "DOMAIN:18:00.0", "aer_fatal": "DOMAIN:05:00.0",
    "aer_nonfatal": "mlx5_6", "mce": "", "edac_ce": "MC0", "edac_ue": "MC0", "hung_task": "", "soft_lockup": "cpu7",
    "oom_kill": "", "nfs_not_responding": "nfs:100.73.159.36", "nvrm_init_failed": "DOMAIN:3a:00.0",
    "nvrm_api_mismatch": "", "nvswitch_fatal": "DOMAIN:06:00.0", "peermem_load_failed": "",
}  # fmt: skip


def _write_line(line: str) -> None:
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _counts(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{url}/metrics", timeout=2).text
    return {
        (s.labels["kind"], s.labels["device"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "dgxdoctor_kernel_events_total"
    }


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[str, str]]:
    if not KMSG.exists() or os.geteuid() != 0:
        pytest.skip("needs root and /dev/kmsg")
    domain = f"{random.randrange(0x100, 0xFFFF):04x}"
    sysfs = tmp_path / "sys"
    for line in (PCI_FIXTURES / "dgx_h100.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            add_pci_device(sysfs, line.replace("0000:", f"{domain}:"))
    port = free_port()
    config = tmp_path / "config.toml"
    disabled = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name != "xid")
    config.write_text(
        f'node = "kmsg-node"\n[daemon]\nlisten = "127.0.0.1:{port}"\n'
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\nsysfs_root = "{sysfs}"\n{disabled}'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    log = (tmp_path / "daemon.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "dgxdoctor", "run", "--config", str(config)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if "dgxdoctor_kmsg_following{" in httpx.get(f"{url}/metrics", timeout=1).text:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail(f"the daemon did not follow the kernel log: {(tmp_path / 'daemon.log').read_text()[-2000:]}")
        yield url, domain
    finally:
        proc.terminate()
        proc.wait(20)


def test_every_kind_reaches_metrics_within_a_second_with_its_device(daemon: tuple[str, str]) -> None:
    url, domain = daemon
    before = _counts(url)
    lines = [PREFIX_RE.sub("", line).replace("0000:", f"{domain}:") for line in FAULTS.read_text().splitlines()]
    for line in lines:
        _write_line(line + "\n")
    written = time.monotonic()
    wanted = {(kind, label.replace("DOMAIN", domain)) for kind, label in EXPECTED_LABELS.items()}
    missing = wanted
    while time.monotonic() - written < 5.0:
        now = _counts(url)
        missing = {k for k in wanted if now.get(k, 0.0) <= before.get(k, 0.0)}
        if not missing:
            break
        time.sleep(0.02)
    elapsed = time.monotonic() - written
    print(f"{len(lines)} kernel lines on /metrics {elapsed * 1000:.0f} ms after the last write")
    assert not missing, f"not on /metrics after {elapsed:.1f} s: {sorted(missing)}"
    assert elapsed < 1.0
    assert _counts(url)[("module_event", "mlx5_1")] >= before.get(("module_event", "mlx5_1"), 0.0) + 1

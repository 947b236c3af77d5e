"""scripts/install-system-deps on a machine that runs its own monitoring: the packages' services are kept from
starting by a policy-rc.d that exists only while apt-get runs (an operator's own one put back after), and a running
``prometheus`` of the operator's is left alone (the script once ended with ``pkill -x prometheus``).

The script runs with a stub ``apt-get`` first on a PATH that lacks ``prometheus-node-exporter``, inside a PID
namespace of its own: a script that kills by name would find only this test's ``prometheus``, never the machine's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "install-system-deps"
# What the script itself runs; everything it checks for is a stub that exists, except prometheus-node-exporter.
TOOLS = ("bash", "env", "mktemp", "mv", "rm", "chmod", "cat", "sleep", "kill", "pgrep", "pkill", "ps")
PRESENT = (
    "promtool",
    "prometheus-alertmanager",
    "ip",
    "systemd-analyze",
    "chromium",
    "python3",
    "dockerd",
    "slurmctld",
    "haproxy",
)

# apt-get: records each call, and for `install` whether policy-rc.d is there and what it answers to a start.
APT_GET = """#!/bin/bash
echo "apt-get $*" >>"$LOG"
if [ "$1" = install ]; then
    if [ -x "$DGXDOCTOR_POLICY_RC_D" ]; then
        "$DGXDOCTOR_POLICY_RC_D" prometheus-node-exporter start; echo "policy-rc.d start -> $?" >>"$LOG"
    else
        echo "no policy-rc.d" >>"$LOG"
    fi
    exit "${APT_EXIT:-0}"
fi
"""

# Inside the PID namespace: the operator's prometheus (its process name is "prometheus"), then the install.
RUN = """
"$FAKE_PROMETHEUS" 600 &
monitoring=$!
"$SCRIPT"; status=$?
sleep 0.2
if kill -0 "$monitoring" 2>/dev/null; then echo "prometheus survived" >>"$LOG"; kill "$monitoring"; fi
exit $status
"""


def _unshare() -> str:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for a PID namespace")
    return unshare


OPERATORS_POLICY = "#!/bin/sh\n# the operator's: no restarts during maintenance\nexit 101\n"


def install(
    tmp_path: Path, apt_exit: int = 0, present: tuple[str, ...] = PRESENT, policy: str | None = None
) -> tuple[int, list[str]]:
    """Run the script (stub apt-get exiting ``apt_exit``; ``policy``: an operator's policy-rc.d already there)."""
    unshare = _unshare()
    bin_dir, sbin = tmp_path / "bin", tmp_path / "sbin"
    bin_dir.mkdir()
    sbin.mkdir()
    if policy is not None:
        (sbin / "policy-rc.d").write_text(policy)
        (sbin / "policy-rc.d").chmod(0o700)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for tool in present:
        (bin_dir / tool).symlink_to(shutil.which("true") or "/bin/true")
    (bin_dir / "apt-get").write_text(APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    fake = tmp_path / "monitoring" / "prometheus"  # sleep under the name that pkill -x prometheus matches
    fake.parent.mkdir()
    fake.symlink_to(shutil.which("sleep") or "/bin/sleep")
    log = tmp_path / "log"
    log.touch()
    env = {
        "PATH": str(bin_dir),
        "LOG": str(log),
        "SCRIPT": str(SCRIPT),
        "FAKE_PROMETHEUS": str(fake),
        "APT_EXIT": str(apt_exit),
        "DGXDOCTOR_POLICY_RC_D": str(sbin / "policy-rc.d"),
    }
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", str(bin_dir / "bash"), "-c", RUN],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode, log.read_text().splitlines()


def test_services_are_kept_from_starting_and_a_running_prometheus_survives(tmp_path: Path) -> None:
    status, log = install(tmp_path)
    assert status == 0
    assert log == [
        "apt-get update -qq",
        "apt-get install -y -qq --no-install-recommends prometheus-node-exporter",
        "policy-rc.d start -> 101",
        "prometheus survived",
    ]
    assert list((tmp_path / "sbin").iterdir()) == []  # the install's policy-rc.d is gone, no copy left


@pytest.mark.parametrize("apt_exit", [0, 100])
def test_an_operators_policy_rc_d_is_put_back_even_when_the_install_fails(tmp_path: Path, apt_exit: int) -> None:
    status, log = install(tmp_path, apt_exit, policy=OPERATORS_POLICY)
    assert (status == 0) == (apt_exit == 0)
    assert "policy-rc.d start -> 101" in log and "prometheus survived" in log
    sbin = tmp_path / "sbin"
    assert [p.name for p in sbin.iterdir()] == ["policy-rc.d"]
    assert (sbin / "policy-rc.d").read_text() == OPERATORS_POLICY
    assert (sbin / "policy-rc.d").stat().st_mode & 0o777 == 0o700


def test_nothing_missing_installs_nothing(tmp_path: Path) -> None:
    status, log = install(tmp_path, present=(*PRESENT, "prometheus-node-exporter"))
    assert status == 0 and log == ["prometheus survived"]
    assert list((tmp_path / "sbin").iterdir()) == []

"""The README's install path, laid out under a temporary root exactly as written, read by the checks.

README: "install `systemd/nccl.env` as `/etc/nccl.env` and `systemd/nccl.sh` as `/etc/profile.d/nccl.sh`".
The shipped nccl.sh only sources nccl.env (``set -a; . /etc/nccl.env; set +a``): both the nccl_env check (its
default env_file) and the bundled probe must see the variables of nccl.env through it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import REPO
from dgxdoctor.checks.nccl import NcclSettings, probe_env
from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.environment import Environment
from dgxdoctor.sources.nccl_env import parse_env_file, read_env_file

SYSTEMD = REPO / "systemd"


def documented_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc" / "profile.d").mkdir(parents=True)
    shutil.copy(SYSTEMD / "nccl.env", root / "etc" / "nccl.env")
    shutil.copy(SYSTEMD / "nccl.sh", root / "etc" / "profile.d" / "nccl.sh")
    return root


def test_the_readme_names_these_two_files() -> None:
    readme = (REPO / "README.md").read_text()
    assert "`systemd/nccl.env` as `/etc/nccl.env`" in readme
    assert (
        "`systemd/nccl.sh` as\n`/etc/profile.d/nccl.sh`" in readme
        or "`systemd/nccl.sh` as `/etc/profile.d/nccl.sh`" in readme
    )


def test_nccl_sh_is_read_through_to_nccl_env(tmp_path: Path) -> None:
    root = documented_root(tmp_path)
    parsed = read_env_file(root / "etc" / "profile.d" / "nccl.sh", root)
    expected = parse_env_file((SYSTEMD / "nccl.env").read_text()).values
    assert parsed.values == expected
    assert parsed.problems == ()
    assert parsed.sourced == ((3, "/etc/nccl.env"),)


def test_nccl_env_check_on_the_documented_files_says_nothing_is_unset(tmp_path: Path) -> None:
    root = documented_root(tmp_path)
    env = Environment(host_root=root, sysfs_root=tmp_path / "sys", proc_root=tmp_path / "proc")
    settings = NcclEnvSettings(env_file=root / "etc" / "profile.d" / "nccl.sh")
    result = NcclEnvCheck(settings, env).run()
    messages = [f.message for f in result.findings]
    assert not [m for m in messages if "is not set" in m], messages
    assert not [f for f in result.findings if f.code == "NCCL_ENV_FILE_LINE"], messages


def test_the_probe_gets_the_documented_variables(tmp_path: Path) -> None:
    root = documented_root(tmp_path)
    env = probe_env(NcclSettings(env_file=root / "etc" / "profile.d" / "nccl.sh"), host_root=root)
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert env["NCCL_SOCKET_IFNAME"] == "bond0"
    assert env["NCCL_IB_GID_INDEX"] == "3"


def test_a_sourced_file_that_is_missing_or_loops_is_said(tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text(". ./b.sh\nNCCL_DEBUG=WARN\n")
    (tmp_path / "b.sh").write_text(". ./a.sh\n")
    parsed = read_env_file(tmp_path / "a.sh", tmp_path)
    assert parsed.values == {"NCCL_DEBUG": "WARN"}
    assert any("nested sources" in problem for _line, problem in parsed.problems)
    (tmp_path / "c.sh").write_text(". /etc/absent.env\n")
    parsed = read_env_file(tmp_path / "c.sh", tmp_path)
    assert parsed.problems and "cannot be read" in parsed.problems[0][1]

"""The shipped unit's sandbox against the paths the checks read and write by default: every default path must be
the host's own inside the unit (a private /tmp hid /tmp/ray: Ray's logs read SKIPPED on every node installed as
documented), and the state directory must be writable. ``systemd-analyze verify`` of the same unit runs in
tests/integration/test_systemd_units.py (it needs the lock: systemd tools are heavy on the shared machine)."""

from __future__ import annotations

from pathlib import PurePosixPath

from conftest import REPO
from dgxdoctor.checks.host import HostSettings
from dgxdoctor.checks.logs import LogsSettings
from dgxdoctor.checks.nccl_env import NcclEnvSettings
from dgxdoctor.config import PathsSettings

UNIT = REPO / "systemd" / "dgxdoctor.service"


def unit_service() -> dict[str, list[str]]:
    """Every ``Key=value`` of [Service]; a key given twice keeps both values (systemd appends list settings)."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section == "[Service]":
            values.setdefault(key, []).append(value)
    return values


def words(service: dict[str, list[str]], key: str) -> list[str]:
    return [w.lstrip("-") for v in service.get(key, []) for w in v.split()]


def under(path: str, top: str) -> bool:
    return PurePosixPath(path).is_relative_to(top)


def hidden(service: dict[str, list[str]], path: str) -> str | None:
    """Why ``path`` is not the host's own inside the unit, or None (systemd.exec(5): PrivateTmp, ProtectHome,
    InaccessiblePaths, TemporaryFileSystem; a Bind*Paths of the path or a parent brings the host's back)."""
    binds = [w.split(":")[0] for key in ("BindPaths", "BindReadOnlyPaths") for w in words(service, key)]
    if any(under(path, b) for b in binds):
        return None
    private_tmp = service.get("PrivateTmp", ["no"])[-1] in ("yes", "true", "1")
    if private_tmp and (under(path, "/tmp") or under(path, "/var/tmp")):
        return "PrivateTmp=yes"
    if service.get("ProtectHome", ["no"])[-1] in ("yes", "tmpfs") and any(
        under(path, h) for h in ("/home", "/root", "/run/user")
    ):
        return "ProtectHome"
    for key in ("InaccessiblePaths", "TemporaryFileSystem"):
        if any(under(path, p.split(":")[0]) for p in words(service, key)):
            return key
    return None


def writable(service: dict[str, list[str]], path: str) -> bool:
    if service.get("ProtectSystem", ["no"])[-1] != "strict":
        return True
    allowed = words(service, "ReadWritePaths")
    allowed += [f"/var/lib/{d}" for d in words(service, "StateDirectory")]
    allowed += [f"/run/{d}" for d in words(service, "RuntimeDirectory")]
    return any(under(path, a) for a in allowed)


def read_by_default() -> dict[str, str]:
    """config key -> default path that a check reads (globs cut at their first wildcard)."""
    paths = {
        "checks.host.ray_log_dir": str(HostSettings().ray_log_dir),
        "checks.nccl_env.env_file": str(NcclEnvSettings().env_file),
        "paths.state_dir": str(PathsSettings().state_dir),
    }
    for i, pattern in enumerate(LogsSettings().ray_paths):
        paths[f"checks.logs.ray_paths[{i}]"] = pattern.split("*", 1)[0]
    return paths


def test_every_default_path_is_the_hosts_inside_the_unit() -> None:
    service = unit_service()
    seen = {key: hidden(service, path) for key, path in read_by_default().items()}
    assert {k: why for k, why in seen.items() if why} == {}
    assert "/tmp/ray" in read_by_default()["checks.host.ray_log_dir"]  # the case that was hidden


def test_the_state_dir_and_temporary_files_are_writable() -> None:
    service = unit_service()
    assert writable(service, str(PathsSettings().state_dir))
    tmpdir = next(v.split("=", 1)[1] for v in service.get("Environment", []) if v.startswith("TMPDIR="))
    assert writable(service, tmpdir) and not hidden(service, tmpdir)


def test_the_model_catches_a_private_tmp() -> None:
    """Proves the check above can fail: the old unit's PrivateTmp=yes hides every Ray default."""
    service = unit_service() | {"PrivateTmp": ["yes"]}
    assert hidden(service, "/tmp/ray/session_latest/logs/") == "PrivateTmp=yes"
    assert hidden(service | {"BindReadOnlyPaths": ["-/tmp/ray"]}, "/tmp/ray/session_latest/logs/") is None

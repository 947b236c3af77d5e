"""TOML config -> validated, frozen Config. Every error is reported at once, each with its key path.

The ``[checks.<name>]`` tables are validated by each check's own ``settings_model``; the root model is
assembled from the explicit registry, so a check's keys live beside its code.
"""

from __future__ import annotations

import socket
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from dgxdoctor.checks.base import CheckSettings
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.environment import Environment

DEFAULT_CONFIG_PATH = Path("/etc/dgxdoctor/config.toml")
EX_CONFIG = 78  # sysexits.h EX_CONFIG


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PathsSettings(_Frozen):
    """Roots of the outside world; tests and containers point these at copies."""

    sysfs_root: Path = Field(Path("/sys"), description="where sysfs is mounted")
    proc_root: Path = Field(Path("/proc"), description="where procfs is mounted")
    kmsg_path: Path = Field(Path("/dev/kmsg"), description="kernel log device")
    state_dir: Path = Field(
        Path("/var/lib/dgxdoctor"), description="small state files (counter baselines, log offsets)"
    )


@cache
def checks_model() -> type[BaseModel]:
    fields: dict[str, Any] = {
        factory.name: (factory.settings_model, Field(default_factory=factory.settings_model)) for factory in ALL_CHECKS
    }
    model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        "ChecksSettings", __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )
    return model


@cache
def config_model() -> type[BaseModel]:
    checks = checks_model()
    model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        "Config",
        __config__=ConfigDict(extra="forbid", frozen=True),
        node=(str | None, Field(None, description="node name in labels and peer reports; default hostname")),
        paths=(PathsSettings, Field(PathsSettings())),
        checks=(checks, Field(default_factory=checks)),
    )
    return model


class ConfigError(Exception):
    """Invalid configuration. ``problems`` holds (key path, reason) pairs, all of them."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"invalid configuration in {source}:"]
        lines += [f"  {path}: {reason}" for path, reason in problems]
        super().__init__("\n".join(lines))


class Config:
    """The validated configuration: a thin, typed face over the frozen pydantic model."""

    def __init__(self, model: BaseModel, source: str) -> None:
        self.model = model
        self.source = source

    @property
    def node(self) -> str:
        node: str | None = self.model.node  # type: ignore[attr-defined]
        return node or socket.gethostname()

    @property
    def paths(self) -> PathsSettings:
        paths: PathsSettings = self.model.paths  # type: ignore[attr-defined]
        return paths

    def check_settings(self, name: str) -> CheckSettings:
        settings: CheckSettings = getattr(self.model.checks, name)  # type: ignore[attr-defined]
        return settings

    def environment(self) -> Environment:
        p = self.paths
        return Environment(
            node=self.node,
            sysfs_root=p.sysfs_root,
            proc_root=p.proc_root,
            kmsg_path=p.kmsg_path,
            state_dir=p.state_dir,
        )


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    try:
        model = config_model().model_validate(data)
    except ValidationError as exc:
        problems = [(_key_path(err["loc"]), _reason(err)) for err in exc.errors()]
        raise ConfigError(source, problems) from None
    return Config(model, source)


def _reason(err: Any) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    value = err.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    return f"{err['msg']}{shown}"


def load_config(path: Path | None) -> Config:
    """Load ``path``; ``None`` means the default path if it exists, else the documented defaults."""
    explicit = path is not None
    path = path or DEFAULT_CONFIG_PATH
    if not path.exists():
        if explicit:
            raise ConfigError(str(path), [("(file)", "no such file")])
        return parse_config({}, "<defaults>")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [("(syntax)", str(exc))]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [("(file)", str(exc))]) from None
    return parse_config(data, str(path))

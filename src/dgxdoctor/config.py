"""TOML config -> validated, frozen Config. Every error is reported at once, each with its key path.

The ``[checks.<name>]`` tables are validated by each check's own ``settings_model``; the root model is
assembled from the explicit registry, so a check's keys live beside its code.
"""

from __future__ import annotations

import difflib
import json
import socket
import tomllib
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from dgxdoctor.checks.base import CheckSettings
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.environment import Environment, Role

DEFAULT_CONFIG_PATH = Path("/etc/dgxdoctor/config.toml")
EX_CONFIG = 78  # sysexits.h EX_CONFIG


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSettings(_Frozen):
    """What this node is. A declared role states what must be there, and its absence is CRITICAL:
    both roles need the GPUs ([checks.gpu] expected_count, expected_model), a Ray raylet, the NCCL environment
    file ([checks.nccl_env] env_file) and the RDMA ports ([checks.infiniband] expected_ports, else at least one);
    the head also needs the Ray head (GCS, dashboard) and vLLM ([checks.vllm] base_url, served_model_name).
    Without a role, what is absent is SKIPPED and `dgxdoctor check` says that nothing was required.
    """

    name: str | None = Field(None, description="node name in labels and peer reports; default hostname")
    role: Role | None = Field(
        None,
        description='"head" (Ray head and vLLM API server) or "worker" (a raylet); unset: nothing required',
        examples=["head"],
    )


class PathsSettings(_Frozen):
    """Roots of the outside world; tests and containers point these at copies."""

    sysfs_root: Path = Field(Path("/sys"), description="where sysfs is mounted")
    proc_root: Path = Field(Path("/proc"), description="where procfs is mounted")
    kmsg_path: Path = Field(Path("/dev/kmsg"), description="kernel log device")
    state_dir: Path = Field(
        Path("/var/lib/dgxdoctor"), description="small state files (counter baselines, log offsets)"
    )


DEFAULT_PORT = 9835
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9835`` for IPv6) -> (host, port); ValueError naming what is wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    # isascii: str.isdigit() accepts "²", which int() refuses; the length keeps int() off huge digit runs
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536):
        raise ValueError(f"port must be 1-65535, got {port_text!r}")
    return host, int(port_text)


class DaemonSettings(_Frozen):
    """``dgxdoctor run``: where it listens, who may read its state, which peers it compares with."""

    listen: str = Field(DEFAULT_LISTEN, description="HOST:PORT of /metrics, /healthz and /state")
    token: str | None = Field(
        None,
        min_length=16,
        description="shared secret peers send as 'Authorization: Bearer ...'; without it /state is loopback-only",
    )
    token_file: Path | None = Field(None, description="file holding the token (instead of token); keep it 0600")
    peers: tuple[str, ...] = Field((), description='dgxdoctor on the other nodes, e.g. ["http://dgx-b:9835"]')
    peer_timeout_s: float = Field(3.0, gt=0, le=60, description="seconds to wait for one peer's /state")
    textfile_path: Path | None = Field(
        None,
        description="also write the exposition here for node_exporter's textfile collector (a *.prom file)",
    )
    textfile_interval_s: float = Field(15.0, gt=0, description="seconds between textfile writes")
    history: int = Field(20, ge=1, le=1000, description="results kept per check for /state and transitions")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("peers")
    @classmethod
    def _check_peers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for peer in value:
            url = urlsplit(peer)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"peer {peer!r} is not an http(s)://HOST:PORT URL")
            if url.path not in ("", "/") or url.query or url.fragment or url.username:
                raise ValueError(f"peer {peer!r}: give only scheme, host and port")
        if len(set(value)) != len(value):
            raise ValueError("a peer is listed twice")
        return tuple(p.rstrip("/") for p in value)

    @model_validator(mode="after")
    def _one_token_source(self) -> DaemonSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set token or token_file, not both")
        return self

    def resolve_token(self) -> str | None:
        """The token itself, reading ``token_file`` if that is how it is given (OSError/ValueError if bad)."""
        if self.token_file is None:
            return self.token
        text = self.token_file.read_text(encoding="utf-8").strip()
        if len(text) < 16:
            raise ValueError(f"{self.token_file}: token shorter than 16 characters")
        return text


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
        node=(NodeSettings, Field(NodeSettings())),
        paths=(PathsSettings, Field(PathsSettings())),
        daemon=(DaemonSettings, Field(DaemonSettings())),
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
        node: NodeSettings = self.model.node  # type: ignore[attr-defined]
        return node.name or socket.gethostname()

    @property
    def role(self) -> Role | None:
        node: NodeSettings = self.model.node  # type: ignore[attr-defined]
        return node.role

    @property
    def paths(self) -> PathsSettings:
        paths: PathsSettings = self.model.paths  # type: ignore[attr-defined]
        return paths

    @property
    def daemon(self) -> DaemonSettings:
        daemon: DaemonSettings = self.model.daemon  # type: ignore[attr-defined]
        return daemon

    def check_settings(self, name: str) -> CheckSettings:
        settings: CheckSettings = getattr(self.model.checks, name)  # type: ignore[attr-defined]
        return settings

    def environment(self, one_shot: bool = True) -> Environment:
        """The seams for this config; the daemon passes ``one_shot=False`` (checks keep history)."""
        p = self.paths
        return Environment(
            one_shot=one_shot,
            node=self.node,
            role=self.role,
            sysfs_root=p.sysfs_root,
            proc_root=p.proc_root,
            kmsg_path=p.kmsg_path,
            state_dir=p.state_dir,
        )


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    if isinstance(data.get("node"), str):  # `node = "dgx-a"`, the form before [node] had a role
        data = {**data, "node": {"name": data["node"]}}
    try:
        model = config_model().model_validate(data)
    except ValidationError as exc:
        problems = [(_key_path(err["loc"]), _reason(err)) for err in exc.errors(include_url=False)]
        raise ConfigError(source, problems) from None
    config = Config(model, source)
    ray_role = getattr(config.check_settings("ray"), "role", "auto")
    if config.role is not None and ray_role not in ("auto", config.role):
        problem = f"{ray_role!r} contradicts node.role {config.role!r} (leave it 'auto' to follow the node's role)"
        raise ConfigError(source, [("checks.ray.role", problem)])
    return config


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` accepts (for "did you mean"); empty where it is not a settings table."""
    model: Any = config_model()
    for part in loc:
        if get_origin(model) is dict:  # a table of tables, e.g. [checks.infiniband.thresholds.<rule>]
            model = get_args(model)[1]
            continue
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = field.annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


_ARRAY_ERRORS = frozenset({"tuple_type", "list_type", "set_type", "frozen_set_type"})


def _reason(err: Any) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=1, cutoff=0.6)
        return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
    value = err.get("input")
    if err["type"] in _ARRAY_ERRORS:
        hint = f", e.g. [{json.dumps(value)}]" if isinstance(value, str) else ""
        return f"expected a TOML array{hint}, got {type(value).__name__} {value!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    shown = "" if isinstance(value, dict) or repr(value) in msg else f" (got {value!r})"
    return f"{msg}{shown}"


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
    except RecursionError:  # tomllib recurses per nesting level: "a = [[[[..." deeper than the stack
        raise ConfigError(str(path), [("(syntax)", "arrays or inline tables nested too deeply")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [("(file)", str(exc))]) from None
    return parse_config(data, str(path))

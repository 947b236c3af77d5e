"""TOML config -> validated, frozen Config. Every error is reported at once, each with its key path.

The ``[checks.<name>]`` tables are validated by each check's own ``settings_model``; the root model is
assembled from the explicit registry, so a check's keys live beside its code.
"""

from __future__ import annotations

import json
import re
import socket
import tomllib
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from dgxdoctor.checks.base import CheckSettings
from dgxdoctor.checks.registry import ALL_CHECKS
from dgxdoctor.environment import Environment, ExecutorKind, Role
from dgxdoctor.sources.fields import HttpUrl
from dgxdoctor.sources.http import http_url
from dgxdoctor.sources.statefile import read_private_file, state_dir_problem

DEFAULT_CONFIG_PATH = Path("/etc/dgxdoctor/config.toml")
EX_CONFIG = 78  # sysexits.h EX_CONFIG


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSettings(_Frozen):
    """What this node is. A declared role states what must be there, and its absence is CRITICAL:
    both roles need the GPUs ([checks.gpu] expected_count, expected_model), the NCCL environment file
    ([checks.nccl_env] env_file) and the RDMA ports ([checks.infiniband] expected_ports, else at least one);
    the head also needs vLLM ([checks.vllm] base_url, served_model_name). With the Ray executor both need a raylet
    and the head the Ray head (GCS, dashboard); with vLLM's multiprocessing executor (executor = "mp") Ray is not
    required and a worker needs its headless vLLM process. Without a role, what is absent is SKIPPED and
    `dgxdoctor check` says that nothing was required.
    """

    name: str | None = Field(None, description="node name in labels and peer reports; default hostname")
    role: Role | None = Field(
        None,
        description='"head" (Ray head and vLLM API server) or "worker" (a raylet); unset: nothing required',
        examples=["head"],
    )
    executor: ExecutorKind | None = Field(
        None,
        description='"ray" (vLLM\'s Ray executor) or "mp" (its multiprocessing executor across nodes: --nnodes, '
        "--headless on the workers; no Ray); unset: read from the running vLLM's command line",
    )


class PathsSettings(_Frozen):
    """Roots of the outside world; tests and containers point these at copies."""

    sysfs_root: Path = Field(Path("/sys"), description="where sysfs is mounted")
    proc_root: Path = Field(Path("/proc"), description="where procfs is mounted")
    kmsg_path: Path = Field(Path("/dev/kmsg"), description="kernel log device")
    host_root: Path = Field(
        Path("/"), description="the host's /: absolute paths named inside files (nccl.sh's `. /etc/nccl.env`)"
    )
    state_dir: Path = Field(
        Path("/var/lib/dgxdoctor"),
        description="small state files (counter baselines, log offsets); must be root's (or dgxdoctor's user's) and "
        "not writable by its group or others",
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


# Peers one agent compares with and asks during a cluster restart: the product is two nodes, a large deployment a few
# dozen; thousands would make every /state and comparison a fan-out the daemon was never sized for.
MAX_PEERS = 64

# user:password@ in a URL (http://admin:pw@dgx-b:9835): a password in a URL is not repeated in an error.
_USERINFO = re.compile(r"://[^/@\s'\"]*@")


class DaemonSettings(_Frozen):
    """``dgxdoctor run``: where it listens, who may read its state, which peers it compares with."""

    listen: str = Field(DEFAULT_LISTEN, description="HOST:PORT of /metrics, /healthz and /state")
    token: str | None = Field(
        None,
        min_length=16,
        description="shared secret peers send as 'Authorization: Bearer ...'; without it /state is loopback-only",
    )
    token_file: Path | None = Field(
        None,
        description="file holding the token (instead of token): a regular file, not a link, root's (or dgxdoctor's "
        "user's), mode 0600; anything else is a config error",
    )
    peers: tuple[str, ...] = Field(
        (),
        max_length=MAX_PEERS,
        description=f'dgxdoctor on the other nodes, e.g. ["http://dgx-b:9835"]; at most {MAX_PEERS}',
    )
    peer_timeout_s: float = Field(3.0, gt=0, le=60, description="seconds to wait for one peer's /state")
    textfile_path: Path | None = Field(
        None,
        description="also write the exposition here for node_exporter's textfile collector (a *.prom file)",
    )
    textfile_interval_s: float = Field(15.0, gt=0, description="seconds between textfile writes")
    max_connections: int = Field(
        256,
        ge=8,
        le=65536,
        description="client connections held at once (Prometheus, peers, curl); over it the longest-idle one is "
        "closed. Never more than the open-file limit leaves free for the checks",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    check_run_min_interval_s: float = Field(
        2.0, ge=0, le=3600, description="POST /check/run (a peer's `check --cluster`): at most one run per this long"
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("peers")
    @classmethod
    def _check_peers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        peers = tuple(http_url(peer, path=False) for peer in value)
        if len(set(peers)) != len(peers):
            raise ValueError("a peer is listed twice")
        return peers

    @model_validator(mode="after")
    def _one_token_source(self) -> DaemonSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set token or token_file, not both")
        return self

    def resolve_token(self) -> str | None:
        """The token itself, reading ``token_file`` if that is how it is given (OSError/ValueError if bad)."""
        if self.token_file is None:
            return self.token
        text = read_private_file(self.token_file).strip()
        if len(text) < 16:
            raise ValueError(f"{self.token_file}: token shorter than 16 characters")
        return text


Argv = tuple[str, ...]


def _argv(*parts: str) -> Argv:
    return tuple(parts)


class RemediationCommands(_Frozen):
    """What each step runs: argv lists (never a shell), defaults for the example units in systemd/.

    ``ray_stop``/``ray_start`` default to ray-head.service on the head and ray-worker.service on a worker.
    With ``[node] executor = "mp"`` the head's vLLM is ``stop_vllm``/``start_vllm`` (set them to
    vllm-head-mp.service) and a worker runs ``worker_vllm_stop``/``worker_vllm_start`` when the head asks.
    """

    restart_vllm: Argv = Field(_argv("systemctl", "restart", "vllm.service"), description="restart vLLM here")
    stop_vllm: Argv = Field(_argv("systemctl", "stop", "vllm.service"), description="cluster restart: stop vLLM")
    start_vllm: Argv = Field(_argv("systemctl", "start", "vllm.service"), description="cluster restart: start vLLM")
    ray_stop: Argv | None = Field(None, description="stop this node's Ray (default: systemctl stop ray-<role>.service)")
    ray_start: Argv | None = Field(
        None, description="start this node's Ray (default: systemctl start ray-<role>.service)"
    )
    worker_vllm_stop: Argv = Field(
        _argv("systemctl", "stop", "vllm-worker-mp.service"),
        description='executor "mp", on a worker: stop its headless vLLM when the head asks',
    )
    worker_vllm_start: Argv = Field(
        _argv("systemctl", "start", "vllm-worker-mp.service"),
        description='executor "mp", on a worker: start its headless vLLM when the head asks',
    )

    @field_validator(
        "restart_vllm", "stop_vllm", "start_vllm", "ray_stop", "ray_start", "worker_vllm_stop", "worker_vllm_start"
    )
    @classmethod
    def _non_empty(cls, value: Argv | None) -> Argv | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("an argv list needs at least the program")
        return value

    def ray(self, verb: Literal["stop", "start"], role: str) -> Argv:
        given = self.ray_stop if verb == "stop" else self.ray_start
        return given if given is not None else ("systemctl", verb, f"ray-{role}.service")

    def worker_argv(self, step: str) -> Argv:
        """What a worker runs for a step the head asks for (the engine's WORKER_STEPS)."""
        if step == "vllm_stop":
            return self.worker_vllm_stop
        if step == "vllm_start":
            return self.worker_vllm_start
        return self.ray("stop" if step == "ray_stop" else "start", "worker")


RemediationAction = Literal["restart_vllm", "restart_cluster", "page"]
DEFAULT_COOLDOWNS: dict[RemediationAction, float] = {"restart_vllm": 300.0, "restart_cluster": 900.0, "page": 3600.0}


class RemediationSettings(_Frozen):
    """Remediation: decide on findings and alerts, and in act mode restart vLLM or the Ray cluster, within the
    guard's limits (docs/remediation.md)."""

    mode: Literal["observe", "act"] = Field(
        "observe", description="observe: decide, log, export, never run anything; act: run the actions"
    )
    role: Literal["head", "worker"] | None = Field(
        None,
        description="head: orchestrates cluster restarts (the node running vLLM and the Ray head); worker: runs its "
        "part only when the head asks over the authenticated API. Default: [node] role; required in act mode",
    )
    hold_s: float = Field(30.0, ge=0, description="a condition must hold this long (since it appeared) before acting")
    vllm_start_grace_s: float = Field(
        900.0, ge=0, description="no action while the vLLM process is younger than this (it is still loading)"
    )
    cooldown_s: dict[RemediationAction, float] = Field(
        default_factory=lambda: dict(DEFAULT_COOLDOWNS),
        description="per action: seconds after one before the next of the same kind",
    )
    budget: int = Field(3, ge=1, description="actions allowed per budget_window_s; one more opens the breaker")
    budget_window_s: float = Field(3600.0, gt=0, description="the budget's sliding window, seconds")
    ladder_window_s: float = Field(
        3600.0, gt=0, description="a problem back within this after a restart climbs the ladder (vLLM, cluster, page)"
    )
    command_timeout_s: float = Field(120.0, gt=0, description="each command's timeout, seconds")
    ray_ready_timeout_s: float = Field(
        300.0, gt=0, description="cluster restart: wait this long for all Ray nodes and GPUs"
    )
    verify_timeout_s: float = Field(
        1800.0, gt=0, description="wait this long for vLLM to answer /health, list the model and complete"
    )
    commands: RemediationCommands = Field(default_factory=RemediationCommands)

    @model_validator(mode="after")
    def _role_when_acting(self) -> RemediationSettings:
        if self.mode == "act" and self.role is None:
            raise ValueError('mode = "act" needs [node] role = "head" or "worker" (only the head orchestrates)')
        return self


class BundleSettings(_Frozen):
    """``dgxdoctor bundle`` and the capture before a restart: limits of one evidence archive."""

    size_cap_bytes: int = Field(
        64 * 2**20, ge=2**16, description="bytes of all files of one node's part; past it files are cut, and it says so"
    )
    deadline_s: float = Field(120.0, gt=0, le=3600, description="`dgxdoctor bundle`: the whole collection's deadline")
    command_timeout_s: float = Field(20.0, gt=0, description="each command of a bundle (nvidia-smi -q, ray status)")
    bug_report_timeout_s: float = Field(
        60.0, gt=0, description="nvidia-bug-report.sh --safe-mode, when installed (bundle only, never the capture)"
    )
    since_s: float = Field(3600.0, gt=0, description="the default window of kernel and service logs (--since)")
    capture_before_restart: bool = Field(True, description="act mode: capture a bundle before every restart")
    capture_deadline_s: float = Field(
        5.0, gt=0, le=60, description="the capture before a restart never delays it longer than this"
    )
    capture_since_s: float = Field(900.0, gt=0, description="the window of logs in a capture before a restart")
    keep: int = Field(10, ge=1, le=1000, description="captures kept in <state_dir>/bundles (the oldest go first)")


class AlertsSettings(_Frozen):
    """Alerts out: where the daemon posts a page when remediation's ladder ends at "page"."""

    alertmanager_url: HttpUrl | None = Field(
        None, description="Alertmanager base URL (its v2 API), e.g. http://alertmanager:9093; unset: log pages only"
    )
    timeout_s: float = Field(5.0, gt=0, le=60, description="timeout of one post to Alertmanager")


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
        remediation=(RemediationSettings, Field(RemediationSettings())),
        alerts=(AlertsSettings, Field(AlertsSettings())),
        bundle=(BundleSettings, Field(BundleSettings())),
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
    def executor(self) -> ExecutorKind | None:
        node: NodeSettings = self.model.node  # type: ignore[attr-defined]
        return node.executor

    @property
    def paths(self) -> PathsSettings:
        paths: PathsSettings = self.model.paths  # type: ignore[attr-defined]
        return paths

    @property
    def daemon(self) -> DaemonSettings:
        daemon: DaemonSettings = self.model.daemon  # type: ignore[attr-defined]
        return daemon

    @property
    def remediation(self) -> RemediationSettings:
        remediation: RemediationSettings = self.model.remediation  # type: ignore[attr-defined]
        return remediation

    @property
    def alerts(self) -> AlertsSettings:
        alerts: AlertsSettings = self.model.alerts  # type: ignore[attr-defined]
        return alerts

    @property
    def bundle(self) -> BundleSettings:
        bundle: BundleSettings = self.model.bundle  # type: ignore[attr-defined]
        return bundle

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
            executor=self.executor,
            sysfs_root=p.sysfs_root,
            proc_root=p.proc_root,
            kmsg_path=p.kmsg_path,
            host_root=p.host_root,
            state_dir=p.state_dir,
            token=self.daemon.resolve_token,
        )


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    if isinstance(data.get("node"), str):  # `node = "dgx-a"`, the form before [node] had a role
        data = {**data, "node": {"name": data["node"]}}
    data = _one_role(data, source)
    try:
        model = config_model().model_validate(data)
    except ValidationError as exc:
        problems = [(_key_path(err["loc"]), _reason(err)) for err in exc.errors(include_url=False)]
        raise ConfigError(source, problems) from None
    config = Config(model, source)
    acting = _acting_problem(config)
    if acting is not None:
        raise ConfigError(source, [acting])
    ray_role = getattr(config.check_settings("ray"), "role", "auto")
    if config.role is not None and ray_role not in ("auto", config.role):
        problem = f"{ray_role!r} contradicts node.role {config.role!r} (leave it 'auto' to follow the node's role)"
        raise ConfigError(source, [("checks.ray.role", problem)])
    return config


def _acting_problem(config: Config) -> tuple[str, str] | None:
    """Act mode runs root commands on what ``POST /alertmanager`` and ``/remediation/step`` deliver: without a token
    any local user could deliver it, so a token is required (``token`` or ``token_file``)."""
    d = config.daemon
    if config.remediation.mode == "act" and d.token is None and d.token_file is None:
        return ("remediation.mode", 'mode = "act" needs daemon.token or daemon.token_file (the webhook and the '
                "head's step requests must be authenticated)")  # fmt: skip
    return None


def _one_role(data: dict[str, Any], source: str) -> dict[str, Any]:
    """``[node] role`` is the node's role; ``[remediation] role`` follows it unless set, and may not contradict it."""
    node, remediation = data.get("node"), data.get("remediation")
    node_role = node.get("role") if isinstance(node, dict) else None
    if not isinstance(remediation, dict) or node_role is None:
        return data
    own = remediation.get("role")
    if own is None:
        return {**data, "remediation": {**remediation, "role": node_role}}
    if own != node_role:
        problem = f"{own!r} contradicts node.role {node_role!r} (leave remediation.role unset: it follows [node] role)"
        raise ConfigError(source, [("remediation.role", problem)])
    return data


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


# Keys whose value is a secret: an error names the key and what is wrong, never the value (logs, /reload answers
# and terminals are read by more people than the token file).
SECRET_KEYS = frozenset({"token", "api_key"})


def _is_secret(loc: tuple[int | str, ...]) -> bool:
    return any(isinstance(part, str) and part in SECRET_KEYS for part in loc)


def _reason(err: Any) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        import difflib  # only for a config with a typo: the daemon does not keep it loaded

        close = difflib.get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=1, cutoff=0.6)
        return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
    value = err.get("input")
    msg = str(err["msg"]).removeprefix("Value error, ")
    if _is_secret(tuple(err["loc"])):
        return f"{msg} (value not shown: a secret)"
    if err["type"] in _ARRAY_ERRORS:
        hint = f", e.g. [{json.dumps(value)}]" if isinstance(value, str) else ""
        return _USERINFO.sub("://***@", f"expected a TOML array{hint}, got {type(value).__name__} {value!r}")
    shown = "" if isinstance(value, dict) or repr(value) in msg else f" (got {value!r})"
    return _USERINFO.sub("://***@", f"{msg}{shown}")


def load_config(path: Path | None) -> Config:
    """Load ``path``; ``None`` means the default path if it exists, else the documented defaults. A state_dir that
    another user owns or may write to is a config error (``statefile.state_dir_problem``)."""
    config = _read_config(path)
    problem = state_dir_problem(config.paths.state_dir)
    if problem is not None:
        raise ConfigError(str(path or DEFAULT_CONFIG_PATH), [("paths.state_dir", problem)])
    return config


def _read_config(path: Path | None) -> Config:
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

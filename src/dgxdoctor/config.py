"""TOML config -> validated, frozen Config. Every error is reported at once, each with its key path.

The ``[checks.<name>]`` tables are validated by each check's own ``settings_model``; the root model is
assembled from the explicit registry, so a check's keys live beside its code. Each table a config names is validated
by its own model and the root built from the parts; a table it does not name is its model's constructed default,
so a start builds the schemas (pydantic-core's validators and serializers) of those tables only.
"""

from __future__ import annotations

import json
import socket
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, create_model

from dgxdoctor.environment import Environment, ExecutorKind, Role
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.settings.alerts import AlertsSettings as AlertsSettings
from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bundle import BundleSettings as BundleSettings
from dgxdoctor.settings.daemon import DEFAULT_LISTEN as DEFAULT_LISTEN
from dgxdoctor.settings.daemon import DaemonSettings as DaemonSettings
from dgxdoctor.settings.daemon import parse_listen as parse_listen
from dgxdoctor.settings.remediation import RemediationSettings as RemediationSettings
from dgxdoctor.sources.statefile import state_dir_problem

if TYPE_CHECKING:
    from dgxdoctor.checks.base import CheckSettings

S = TypeVar("S", bound="CheckSettings")

DEFAULT_CONFIG_PATH = Path("/etc/dgxdoctor/config.toml")
EX_CONFIG = 78  # sysexits.h EX_CONFIG


class NodeSettings(Frozen):
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


class PathsSettings(Frozen):
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


class Sections(Frozen):
    """The tables every config has. ``checks`` is the registry's: ``config_model`` narrows it to one field per
    check, each that check's own ``settings_model``."""

    # Defaults are instances, not factories: pydantic inspects a factory's signature (for a model class, its whole
    # __signature__), a cost paid at every start; a frozen table is never changed through a default anyway. They
    # are constructed, not validated: validating builds a model's schema, and a table a config does not name never
    # needs one (tests/unit/test_config_sections.py holds every constructed default equal to the validated one).
    node: NodeSettings = NodeSettings.model_construct()
    paths: PathsSettings = PathsSettings.model_construct()
    daemon: DaemonSettings = DaemonSettings.model_construct()
    remediation: RemediationSettings = RemediationSettings.model_construct()
    alerts: AlertsSettings = AlertsSettings.model_construct()
    bundle: BundleSettings = BundleSettings.model_construct()
    checks: BaseModel = Frozen.model_construct()


@cache
def section_models() -> dict[str, type[BaseModel]]:
    """The top-level tables but ``checks``, in the order a config's problems are reported."""
    return {name: cast(type[BaseModel], f.annotation) for name, f in Sections.model_fields.items() if name != "checks"}


@cache
def check_models() -> dict[str, type[CheckSettings]]:
    """``[checks.<name>]`` -> the check's ``settings_model``, in the registry's order. The registry (every check
    module) is imported here, when a config is parsed, not when this module is: the layers that only need a
    settings table import ``dgxdoctor.settings``."""
    from dgxdoctor.checks.registry import ALL_CHECKS

    return {factory.name: factory.settings_model for factory in ALL_CHECKS}


@cache
def checks_model() -> type[BaseModel]:
    """One field per registered check (the shape of ``config.model.checks``; no schema is built for it)."""
    fields: dict[str, Any] = {name: (model, model.model_construct()) for name, model in check_models().items()}
    return create_model("ChecksSettings", __base__=Frozen, **fields)


@cache
def config_model() -> type[Sections]:
    checks = checks_model()
    return create_model("Config", __base__=Sections, checks=(checks, checks.model_construct()))


# user:password@ in a URL (http://admin:pw@dgx-b:9835): a password in a URL is not repeated in an error.
_USERINFO = lazy_compile(r"://[^/@\s'\"]*@")


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

    def __init__(self, model: Sections, source: str) -> None:
        self.model = model
        self.source = source

    @property
    def node(self) -> str:
        return self.model.node.name or socket.gethostname()

    @property
    def role(self) -> Role | None:
        return self.model.node.role

    @property
    def executor(self) -> ExecutorKind | None:
        return self.model.node.executor

    @property
    def paths(self) -> PathsSettings:
        return self.model.paths

    @property
    def daemon(self) -> DaemonSettings:
        return self.model.daemon

    @property
    def remediation(self) -> RemediationSettings:
        return self.model.remediation

    @property
    def alerts(self) -> AlertsSettings:
        return self.model.alerts

    @property
    def bundle(self) -> BundleSettings:
        return self.model.bundle

    def check_settings(self, name: str) -> CheckSettings:
        """``[checks.<name>]`` as the check's own model (KeyError for a name the registry does not have)."""
        from dgxdoctor.checks.base import CheckSettings

        settings = getattr(self.model.checks, name, None)
        if not isinstance(settings, CheckSettings):
            raise KeyError(f"no check named {name!r}")
        return settings

    def settings_of(self, name: str, model: type[S]) -> S:
        """``[checks.<name>]`` typed as ``model`` (its check's ``settings_model``; TypeError otherwise)."""
        from dgxdoctor.checks.base import own_settings

        return own_settings(name, self.check_settings(name), model)

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


Problems = list[tuple[str, str]]


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    if isinstance(data.get("node"), str):  # `node = "dgx-a"`, the form before [node] had a role
        data = {**data, "node": {"name": data["node"]}}
    data = _one_role(data, source)
    problems: Problems = []
    model = _validated_config(data, problems)
    if model is None:
        raise ConfigError(source, problems)
    config = Config(model, source)
    acting = _acting_problem(config)
    if acting is not None:
        raise ConfigError(source, [acting])
    from dgxdoctor.checks.ray import RaySettings

    ray_role = config.settings_of("ray", RaySettings).role
    if config.role is not None and ray_role not in ("auto", config.role):
        problem = f"{ray_role!r} contradicts node.role {config.role!r} (leave it 'auto' to follow the node's role)"
        raise ConfigError(source, [("checks.ray.role", problem)])
    return config


def _validated_config(data: dict[str, Any], problems: Problems) -> Sections | None:
    """Each table ``data`` names validated by its own model, every other one its constructed default: a config
    builds the schemas of the tables it names, not of all of them. Problems in the order one root model reported
    them: the tables in order, then unknown keys."""
    tables = {name: _validated(model, data[name], (name,), problems) for name, model in _present(data)}
    checks = _validated_checks(data["checks"], problems) if "checks" in data else None
    problems += [_unknown((key,), data[key]) for key in data if key not in Sections.model_fields]
    if problems:
        return None
    root = config_model()
    values: dict[str, Any] = {name: _or_default(tables.get(name), model) for name, model in section_models().items()}
    values["checks"] = _or_default(checks, checks_model())
    return root.model_construct(_fields_set=set(data) & set(root.model_fields), **values)


def _present(data: dict[str, Any]) -> list[tuple[str, type[BaseModel]]]:
    return [(name, model) for name, model in section_models().items() if name in data]


def _validated_checks(value: object, problems: Problems) -> BaseModel | None:
    """``[checks]``: each named check's table by its own ``settings_model``; an unknown name is an unknown key."""
    if not isinstance(value, dict):
        msg = "Input should be a valid dictionary or instance of ChecksSettings"
        problems.append(("checks", _reason({"type": "model_type", "loc": ("checks",), "msg": msg, "input": value})))
        return None
    models = check_models()
    present = [(name, model) for name, model in models.items() if name in value]
    tables = {name: _validated(model, value[name], ("checks", name), problems) for name, model in present}
    problems += [_unknown(("checks", name), value[name]) for name in value if name not in models]
    if problems:
        return None
    values = {name: _or_default(tables.get(name), model) for name, model in models.items()}
    return checks_model().model_construct(_fields_set=set(tables), **values)


def _validated(model: type[BaseModel], value: object, loc: tuple[str, ...], problems: Problems) -> BaseModel | None:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            full_loc = (*loc, *err["loc"])
            problems.append((_key_path(full_loc), _reason({**err, "loc": full_loc})))
        return None


def _or_default(table: BaseModel | None, model: type[BaseModel]) -> BaseModel:
    return model.model_construct() if table is None else table


def _unknown(loc: tuple[str, ...], value: object) -> tuple[str, str]:
    err = {"type": "extra_forbidden", "loc": loc, "msg": "Extra inputs are not permitted", "input": value}
    return (_key_path(loc), _reason(err))


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
    import tomllib  # only for a file: the defaults load no TOML parser (benchmarks/startup.py)

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [("(syntax)", str(exc))]) from None
    except RecursionError:  # tomllib recurses per nesting level: "a = [[[[..." deeper than the stack
        raise ConfigError(str(path), [("(syntax)", "arrays or inline tables nested too deeply")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [("(file)", str(exc))]) from None
    return parse_config(data, str(path))

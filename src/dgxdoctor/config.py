"""TOML config -> validated, frozen Config. Every error is reported at once, each with its key path.

The ``[checks.<name>]`` tables are validated by each check's own ``settings_model``; the root model is
assembled from the explicit registry, so a check's keys live beside its code. Each table a config names is decoded
on its own by msgspec (``dgxdoctor.validation``), so every table's problem is reported at once (msgspec stops at a
table's first); the root is built from the parts, and a table the config does not name is its model's default.
"""

from __future__ import annotations

import pwd
import socket
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import msgspec
from msgspec import Meta, Struct, defstruct

from dgxdoctor.environment import Environment, ExecutorKind, Role
from dgxdoctor.result import DEFAULT_GROUP
from dgxdoctor.settings.alerts import AlertsSettings as AlertsSettings
from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bundle import BundleSettings as BundleSettings
from dgxdoctor.settings.daemon import DEFAULT_LISTEN as DEFAULT_LISTEN
from dgxdoctor.settings.daemon import DaemonSettings as DaemonSettings
from dgxdoctor.settings.daemon import parse_listen as parse_listen
from dgxdoctor.settings.fleet import FleetSettings as FleetSettings
from dgxdoctor.settings.readiness import ReadinessSettings as ReadinessSettings
from dgxdoctor.settings.remediation import RemediationSettings as RemediationSettings
from dgxdoctor.sources.container import DEFAULT_RUNTIME, Container, ContainerName, RuntimeProgram
from dgxdoctor.sources.statefile import state_dir_problem
from dgxdoctor.validation import validate

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    from dgxdoctor.checks.base import CheckSettings
    from dgxdoctor.fleet.discovery import Where

S = TypeVar("S", bound="CheckSettings")

DEFAULT_CONFIG_PATH = Path("/etc/dgxdoctor/config.toml")
EX_CONFIG = 78  # sysexits.h EX_CONFIG


# A serving group's name: a Prometheus label value and a word in messages, so short and plain. "unknown" is what an
# older agent's document (which names no group) is read as.
GroupName = Annotated[str, Meta(min_length=1, max_length=63, pattern=r"^(?!unknown$)[A-Za-z0-9][A-Za-z0-9_.-]*$")]


# A login name (useradd's rule, as Debian allows: letters, digits, _ . -, a trailing $) or a uid in digits.
UserName = Annotated[str, Meta(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$")]


class NodeSettings(Frozen, frozen=True):
    """What this node is. A declared role states what must be there, and its absence is CRITICAL:
    both roles need the GPUs ([checks.gpu] expected_count, expected_model), the NCCL environment file
    ([checks.nccl_env] env_file) and the RDMA ports ([checks.infiniband] expected_ports, else at least one);
    the head also needs vLLM ([checks.vllm] base_url, served_model_name). With the Ray executor both need a raylet
    and the head the Ray head (GCS, dashboard); with vLLM's multiprocessing executor (executor = "mp") Ray is not
    required and a worker needs its headless vLLM process. Without a role, what is absent is SKIPPED and
    `dgxdoctor check` says that nothing was required.
    """

    name: Annotated[str | None, Meta(description="node name in labels and peer reports; default hostname")] = None
    role: Annotated[
        Role | None,
        Meta(
            description='"head" (Ray head and vLLM API server) or "worker" (a raylet); unset: nothing required',
            examples=["head"],
        ),
    ] = None
    executor: Annotated[
        ExecutorKind | None,
        Meta(
            description='"ray" (vLLM\'s Ray executor) or "mp" (its multiprocessing executor across nodes: --nnodes, '
            "--headless on the workers; no Ray); unset: read from the running vLLM's command line"
        ),
    ] = None
    serving_user: Annotated[
        UserName | None,
        Meta(
            description="the user that runs vLLM and Ray when it is neither root nor dgxdoctor's own (a name or a "
            "uid): its processes are believed beside theirs (its Python is still run only when named in "
            "serving_python). A process of any other user is never taken for the serving vLLM, its ranks or Ray's "
            "daemons, whatever its command line or title (anyone can `exec -a VLLM::Worker_TP3`), nor is its "
            "listener on [checks.vllm] base_url's port (never asked, vLLM judged as not listening); look-alikes "
            "are counted (dgxdoctor_vllm_lookalikes_ignored). Unset: root and "
            "dgxdoctor's user only, as the shipped units run vLLM and Ray",
        ),
    ] = None
    container: Annotated[
        ContainerName | None,
        Meta(
            description="vLLM runs in this container (the runbook's `docker run --gpus all --network=host "
            "--ipc=host ...`; docs/container.md): its processes are found through the runtime (`docker inspect`: "
            "the container's first process and its PID namespace, whatever their uid), its environment and log "
            "(`docker logs`) are read, and remediation restarts it (`docker restart NAME`) unless "
            "[remediation.commands] says otherwise. Unset: vLLM runs on the host",
        ),
    ] = None
    container_runtime: Annotated[
        RuntimeProgram,
        Meta(description="the container runtime's program: a name found in PATH or an absolute path (podman too)"),
    ] = DEFAULT_RUNTIME
    group: Annotated[
        GroupName | None,
        Meta(
            description="the serving group this node belongs to: the nodes of one tensor/pipeline-parallel vLLM "
            'replica, e.g. "glm-a" (letters, digits, _ . -, at most 63, not "unknown"). On every finding, in /state '
            "and as dgxdoctor_node_info{node,group}, which the shipped rules join: the peer comparison compares "
            "within a group and the groups with each other, and Alertmanager groups the alerts by it "
            f'(docs/fleet.md). Unset: "{DEFAULT_GROUP}", one group for every node without one',
            examples=["glm-a"],
        ),
    ] = None


class PathsSettings(Frozen, frozen=True):
    """Roots of the outside world; tests and containers point these at copies."""

    sysfs_root: Annotated[Path, Meta(description="where sysfs is mounted")] = Path("/sys")
    proc_root: Annotated[Path, Meta(description="where procfs is mounted")] = Path("/proc")
    kmsg_path: Annotated[Path, Meta(description="kernel log device")] = Path("/dev/kmsg")
    host_root: Annotated[
        Path, Meta(description="the host's /: absolute paths named inside files (nccl.sh's `. /etc/nccl.env`)")
    ] = Path("/")
    state_dir: Annotated[
        Path,
        Meta(
            description="small state files (counter baselines, log offsets); must be root's "
            "(or dgxdoctor's user's) and not writable by its group or others"
        ),
    ] = Path("/var/lib/dgxdoctor")


class Sections(Frozen, frozen=True):
    """The tables every config has. ``checks`` is the registry's: ``config_model`` narrows it to one field per
    check, each that check's own ``settings_model``."""

    node: NodeSettings = NodeSettings()
    paths: PathsSettings = PathsSettings()
    daemon: DaemonSettings = DaemonSettings()
    remediation: RemediationSettings = RemediationSettings()
    readiness: ReadinessSettings = ReadinessSettings()
    alerts: AlertsSettings = AlertsSettings()
    bundle: BundleSettings = BundleSettings()
    fleet: FleetSettings = FleetSettings()
    checks: Frozen = Frozen()


@cache
def section_models() -> dict[str, type[Frozen]]:
    """The top-level tables but ``checks``, in the order a config's problems are reported."""
    defaults = dict(zip(Sections.__struct_fields__, Sections.__struct_defaults__, strict=True))
    return {name: type(default) for name, default in defaults.items() if name != "checks"}


@cache
def check_models() -> dict[str, type[CheckSettings]]:
    """``[checks.<name>]`` -> the check's ``settings_model``, in the registry's order. The registry (every check
    module) is imported here, when a config is parsed, not when this module is: the layers that only need a
    settings table import ``dgxdoctor.settings``."""
    from dgxdoctor.checks.registry import ALL_CHECKS

    return {factory.name: factory.settings_model for factory in ALL_CHECKS}


@cache
def checks_model() -> type[Frozen]:
    """One field per registered check (the shape of ``config.model.checks``)."""
    fields = [(name, model, model()) for name, model in check_models().items()]
    return cast(type[Frozen], defstruct("ChecksSettings", fields, bases=(Frozen,), module=__name__, frozen=True))


@cache
def config_model() -> type[Sections]:
    checks = checks_model()
    root = defstruct("Config", [("checks", checks, checks())], bases=(Sections,), module=__name__, frozen=True)
    return cast(type[Sections], root)


class ConfigError(Exception):
    """Invalid configuration. ``problems`` holds (key path, reason) pairs, all of them: for a table msgspec
    refused, the table and msgspec's message (which ends with the full key path, ``- at `$.daemon.port```)."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"invalid configuration in {source}:"]
        lines += [f"  {path}: {reason}" for path, reason in problems]
        super().__init__("\n".join(lines))


class Config:
    """The validated configuration: a thin, typed face over the frozen, validated tables."""

    def __init__(self, model: Sections, source: str) -> None:
        self.model = model
        self.source = source

    @property
    def node(self) -> str:
        return self.model.node.name or socket.gethostname()

    @property
    def group(self) -> str:
        """``[node] group``, or the group of every node that names none."""
        return self.model.node.group or DEFAULT_GROUP

    @property
    def role(self) -> Role | None:
        return self.model.node.role

    @property
    def executor(self) -> ExecutorKind | None:
        return self.model.node.executor

    @property
    def serving_uid(self) -> int | None:
        """The uid of ``[node] serving_user`` (checked when the config was read); None when unset or gone since."""
        user = self.model.node.serving_user
        return None if user is None else user_uid(user)

    @property
    def container(self) -> Container | None:
        """``[node] container`` with its runtime; None when vLLM runs on the host."""
        node = self.model.node
        return None if node.container is None else Container(node.container, node.container_runtime)

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
    def readiness(self) -> ReadinessSettings:
        return self.model.readiness

    @property
    def alerts(self) -> AlertsSettings:
        return self.model.alerts

    @property
    def bundle(self) -> BundleSettings:
        return self.model.bundle

    @property
    def fleet(self) -> FleetSettings:
        return self.model.fleet

    def peer_sources(self) -> Where:
        """Where ``fleet.discovery`` finds the peers: ``[fleet] peer_sources`` and what each needs."""
        from dgxdoctor.checks.ray import RaySettings
        from dgxdoctor.fleet.discovery import Where

        fleet, daemon, ray = self.fleet, self.daemon, self.settings_of("ray", RaySettings)
        return Where(
            static=daemon.peers, sources=fleet.peer_sources, ray_dashboard=ray.dashboard_url,
            ray_token_file=ray.auth_token_file, prometheus_url=fleet.prometheus_url,
            job=fleet.job, dns_name=fleet.dns_name, agent_port=fleet.agent_port, agent_scheme=fleet.agent_scheme,
            timeout_s=daemon.peer_timeout_s,
        )  # fmt: skip

    def own_agent(self) -> Callable[[str], bool]:
        """Whether a peer URL is this node's own agent (``[daemon] listen``)."""
        from dgxdoctor.fleet.discovery import own_agent

        host, port = parse_listen(self.daemon.listen)
        return own_agent(host, port, (self.node,))

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
            group=self.group,
            role=self.role,
            executor=self.executor,
            serving_uid=self.serving_uid,
            container=self.container,
            sysfs_root=p.sysfs_root,
            proc_root=p.proc_root,
            kmsg_path=p.kmsg_path,
            host_root=p.host_root,
            state_dir=p.state_dir,
            token=self.daemon.resolve_token,
            peer_tls=self._peer_tls,
        )

    def _peer_tls(self) -> ssl.SSLContext | None:
        from dgxdoctor.sources.tls import peer_client_context

        d = self.daemon
        return peer_client_context(d.peer_ca_file, d.tls_cert_file, d.tls_key_file)

    def warnings(self) -> list[str]:
        """What still works but should change (deprecated keys): shown by the commands, logged by the daemon."""
        return self.daemon.deprecations()


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
    user = config.model.node.serving_user
    if user is not None and user_uid(user) is None:
        raise ConfigError(source, [("node.serving_user", f"no user {user!r} on this host (a name or a uid)")])
    from dgxdoctor.checks.ray import RaySettings

    ray_role = config.settings_of("ray", RaySettings).role
    if config.role is not None and ray_role not in ("auto", config.role):
        problem = f"{ray_role!r} contradicts node.role {config.role!r} (leave it 'auto' to follow the node's role)"
        raise ConfigError(source, [("checks.ray.role", problem)])
    return config


def _validated_config(data: dict[str, Any], problems: Problems) -> Sections | None:
    """Each table ``data`` names validated by its own model, every other one its default. Problems in the order
    of the tables, then unknown tables."""
    tables = {name: _validated(model, data[name], (name,), problems) for name, model in _present(data)}
    checks = _validated_checks(data["checks"], problems) if "checks" in data else None
    known = Sections.__struct_fields__
    problems += [(key, _unknown(key, known, "table")) for key in data if key not in known]
    if problems:
        return None
    values: dict[str, Any] = {name: tables.get(name) or model() for name, model in section_models().items()}
    values["checks"] = checks or checks_model()()
    return config_model()(**values)


def _present(data: dict[str, Any]) -> list[tuple[str, type[Frozen]]]:
    return [(name, model) for name, model in section_models().items() if name in data]


def _validated_checks(value: object, problems: Problems) -> Frozen | None:
    """``[checks]``: each named check's table by its own ``settings_model``; an unknown name is an unknown table."""
    if not isinstance(value, dict):
        problems.append(("checks", f"expected a table of check tables, got {type(value).__name__}"))
        return None
    models = check_models()
    present = [(name, model) for name, model in models.items() if name in value]
    tables = {name: _validated(model, value[name], ("checks", name), problems) for name, model in present}
    problems += [(f"checks.{name}", _unknown(name, tuple(models), "check")) for name in value if name not in models]
    if problems:
        return None
    return checks_model()(**{name: tables.get(name) or model() for name, model in models.items()})


def _validated(model: type[Frozen], value: object, loc: tuple[str, ...], problems: Problems) -> Frozen | None:
    """``value`` as ``model``, decoded where it sits in the file (``{"checks": {"nccl": value}}``) so that
    msgspec's message names the whole key path; None, and the table's problem added, when it is refused."""
    for key in reversed(loc):
        value = {key: value}
    try:
        decoded: Any = validate(_placed(model, loc), value)
    except msgspec.ValidationError as exc:
        problems.append((".".join(loc), f"{exc}{_did_you_mean(model, value, loc)}"))
        return None
    for key in loc:
        decoded = getattr(decoded, key)
    return cast(Frozen, decoded)


@cache
def _placed(model: type[Frozen], loc: tuple[str, ...]) -> type[Struct]:
    """A record holding ``model`` at ``loc``: ``_validated`` decodes a table as the file holds it."""
    placed: type[Struct] = model
    for key in reversed(loc):
        placed = defstruct("_" + "_".join(loc), [(key, placed)], module=__name__)
    return placed


def _did_you_mean(model: type[Frozen], value: Any, loc: tuple[str, ...]) -> str:
    """A hint for a mistyped key of the table itself (msgspec names it; this names the key it resembles)."""
    for key in loc:
        value = value[key]
    if not isinstance(value, dict):
        return ""
    import difflib  # only for a config with a problem: the daemon does not keep it loaded

    for key in value:
        if key not in model.__struct_fields__:
            close = difflib.get_close_matches(str(key), model.__struct_fields__, n=1, cutoff=0.6)
            if close:
                return f" ({key!r}: did you mean {close[0]!r}?)"
    return ""


def _unknown(key: str, known: tuple[str, ...], what: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"unknown {what}" + (f" (did you mean {close[0]!r}?)" if close else "")


def user_uid(user: str) -> int | None:
    """The uid of a user name or of a uid given as digits; None when this host has no such user."""
    if user.isascii() and user.isdigit():
        return int(user) if len(user) <= 10 and int(user) < 2**32 - 1 else None
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _acting_problem(config: Config) -> tuple[str, str] | None:
    """Act mode runs root commands on what ``POST /alertmanager`` and ``/remediation/step`` deliver; both refuse
    everyone without their token, so act mode without one could never act: a config error, not a silent no-op."""
    d = config.daemon
    tokens = (d.alert_token_file, d.peer_token_file, d.token, d.token_file)
    if config.remediation.mode == "act" and all(t is None for t in tokens):
        return ("remediation.mode", 'mode = "act" needs daemon.alert_token_file (Alertmanager\'s webhook) and '
                "daemon.peer_token_file (the head's step requests to its workers)")  # fmt: skip
    return None


def _one_role(data: dict[str, Any], source: str) -> dict[str, Any]:
    """``[node] role`` is the node's role; ``[remediation] role`` follows it unless set, and may not contradict it.
    Without a ``[remediation]`` table too: observe mode (the default) decides as act mode would, role included."""
    node, remediation = data.get("node"), data.get("remediation", {})
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
    from dgxdoctor.compat import tomllib  # only for a file: the defaults load no TOML parser (benchmarks/startup.py)

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [("(syntax)", str(exc))]) from None
    except RecursionError:  # tomllib recurses per nesting level: "a = [[[[..." deeper than the stack
        raise ConfigError(str(path), [("(syntax)", "arrays or inline tables nested too deeply")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [("(file)", str(exc))]) from None
    return parse_config(data, str(path))

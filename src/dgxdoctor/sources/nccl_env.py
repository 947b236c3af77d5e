"""NCCL environment: the tutorial's /etc/profile.d/nccl.sh, a running process's environ, and the sysfs
facts the variables must agree with. Parsing only; nothing here is ever sourced or executed.

References:
- NCCL environment variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): NCCL_SOCKET_IFNAME
  and NCCL_IB_HCA take comma lists of prefixes; a leading ``^`` excludes, a leading ``=`` (after ``^`` if both)
  asks for exact names; NCCL_IB_HCA entries may carry ``:port``.
- Linux Documentation/ABI/stable/sysfs-class-infiniband: /sys/class/infiniband/<dev>/ports/<port>/
  {state, link_layer, gids/<index>, gid_attrs/types/<index>}.
- Linux Documentation/ABI/testing/sysfs-class-net: /sys/class/net/<iface>/{type, flags, operstate, address};
  type 772 is ARPHRD_LOOPBACK, flags bit 0x8 is IFF_LOOPBACK (include/uapi/linux/if.h, if_arp.h).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dgxdoctor.result import Finding, Status

# A shell variable name: "NCCL_IB_HCA" in "export NCCL_IB_HCA=mlx5_0,mlx5_1".
VAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables whose values are node facts (compared across nodes) and whose drift between file and process matters.
WATCHED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_")
# Per-node by design (the tutorial: "只有 VLLM_HOST_IP 按本机 IP 改"): kept apart from the compared facts.
HOST_IP_VAR = "VLLM_HOST_IP"

ARPHRD_LOOPBACK = 772
IFF_UP = 0x1
IFF_LOOPBACK = 0x8


@dataclass(frozen=True)
class EnvFile:
    values: dict[str, str]
    # (line number, what is wrong) for lines that are not plain assignments; they are ignored, never run.
    problems: tuple[tuple[int, str], ...] = ()


def parse_env_file(text: str) -> EnvFile:
    """Assignments of a profile.d-style file: ``export A=b``, ``A=b``, quotes, comments.

    Anything else (commands, ``$(...)``, conditionals) is reported as a problem and ignored; values keep
    ``$VAR`` text unexpanded (the file is data here, never a script)."""
    values: dict[str, str] = {}
    problems: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            words = shlex.split(stripped, comments=True, posix=True)
        except ValueError as exc:
            problems.append((number, f"cannot be split ({exc}): {stripped!r}"))
            continue
        if not words:
            continue
        exported = words[0] == "export"
        if exported:
            words = words[1:]
        assignments: list[tuple[str, str]] = []
        plain = bool(words) or exported
        for word in words:
            name, eq, value = word.partition("=")
            if eq and VAR_NAME_RE.match(name):
                assignments.append((name, value))
            elif not (exported and VAR_NAME_RE.match(word)):
                # "export NAME" marks a variable and sets nothing; anything else is a command
                plain = False
                break
        if not plain:
            problems.append((number, f"not a plain assignment, ignored: {stripped!r}"))
            continue
        for name, value in assignments:
            if "$(" in value or "`" in value:
                problems.append((number, f"{name}: command substitution is not evaluated: {stripped!r}"))
            values[name] = value
    return EnvFile(values, tuple(problems))


def parse_environ(data: bytes) -> dict[str, str]:
    """/proc/<pid>/environ: NUL-separated ``NAME=value`` entries (proc(5))."""
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        if not entry:
            continue
        name, eq, value = entry.decode("utf-8", errors="replace").partition("=")
        if eq and name:
            env[name] = value
    return env


def watched(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(WATCHED_PREFIXES) or k == HOST_IP_VAR}


@dataclass(frozen=True)
class NameSpec:
    """A parsed NCCL_SOCKET_IFNAME / NCCL_IB_HCA value."""

    exclude: bool
    exact: bool
    # (name, port or None); port only for NCCL_IB_HCA ("mlx5_0:1").
    entries: tuple[tuple[str, int | None], ...]

    def matches(self, name: str) -> bool:
        """Whether ``name`` is selected by the entries (before applying ``exclude``)."""
        return any((name == n) if self.exact else name.startswith(n) for n, _port in self.entries)


class SpecError(ValueError):
    pass


def parse_name_spec(value: str, *, allow_port: bool) -> NameSpec:
    """``^=mlx5_0:1,mlx5_1`` -> exclude, exact, [("mlx5_0", 1), ("mlx5_1", None)]."""
    text = value.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    entries: list[tuple[str, int | None]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, colon, port_text = item.partition(":")
        port: int | None = None
        if colon:
            if not allow_port:
                raise SpecError(f"{item!r}: an interface name has no ':port'")
            # isascii: str.isdigit() accepts "²", which int() refuses; the length keeps int() off huge digit runs
            if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 and int(port_text) >= 1):
                raise SpecError(f"{item!r}: port must be a positive number (at most 5 digits)")
            port = int(port_text)
        if not name:
            raise SpecError(f"{item!r}: empty name")
        entries.append((name, port))
    if not entries:
        raise SpecError(f"{value!r} names nothing")
    return NameSpec(exclude, exact, tuple(entries))


@dataclass(frozen=True)
class NetInterface:
    name: str
    type: int | None
    flags: int | None
    operstate: str | None

    @property
    def loopback(self) -> bool:
        return (
            self.name == "lo"
            or self.type == ARPHRD_LOOPBACK
            or (self.flags is not None and bool(self.flags & IFF_LOOPBACK))
        )

    @property
    def up(self) -> bool:
        if self.operstate is not None and self.operstate != "unknown":
            return self.operstate == "up"
        return self.flags is not None and bool(self.flags & IFF_UP)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def read_net_interfaces(sysfs_root: Path) -> dict[str, NetInterface]:
    base = sysfs_root / "class" / "net"
    found: dict[str, NetInterface] = {}
    if not base.is_dir():
        return found
    for entry in sorted(base.iterdir()):
        found[entry.name] = NetInterface(
            entry.name,
            _int(_read(entry / "type")),
            _int(_read(entry / "flags"), 16),
            _read(entry / "operstate"),
        )
    return found


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str | None  # "4: ACTIVE"
    link_layer: str | None  # "InfiniBand" | "Ethernet"
    gids: dict[int, str] = field(default_factory=dict)
    gid_types: dict[int, str] = field(default_factory=dict)


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def read_ib_ports(sysfs_root: Path) -> dict[str, dict[int, IbPort]]:
    """device -> port -> IbPort. gids/<i> reads "fe80:0000:...:1a2b"; gid_attrs/types/<i> reads "RoCE v2"
    or "IB/RoCE v1" (and fails with EINVAL on an unused index: absent here)."""
    base = sysfs_root / "class" / "infiniband"
    devices: dict[str, dict[int, IbPort]] = {}
    if not base.is_dir():
        return devices
    for dev in sorted(base.iterdir()):
        ports: dict[int, IbPort] = {}
        ports_dir = dev / "ports"
        if ports_dir.is_dir():
            for port_dir in sorted(ports_dir.iterdir()):
                number = _int(port_dir.name)
                if number is None:
                    continue
                gids = {i: v for i, v in _indexed(port_dir / "gids")}
                types = {i: v for i, v in _indexed(port_dir / "gid_attrs" / "types")}
                ports[number] = IbPort(
                    dev.name, number, _read(port_dir / "state"), _read(port_dir / "link_layer"), gids, types
                )
        devices[dev.name] = ports
    return devices


def _indexed(directory: Path) -> Iterator[tuple[int, str]]:
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        index = _int(entry.name)
        if index is None:
            continue
        value = _read(entry)
        if value:
            yield index, value


def gid_is_zero(gid: str) -> bool:
    return gid.replace(":", "").strip("0") == ""


def is_local_address(value: str, addresses: set[str]) -> tuple[bool, str | None]:
    """(is one of ``addresses``, error text when ``value`` is not an IP address at all)."""
    try:
        ip = ipaddress.ip_address(value.strip())
    except ValueError:
        return False, f"{value!r} is not an IP address"
    normal = {str(ipaddress.ip_address(a.split("%", 1)[0])) for a in addresses if _is_ip(a)}
    return str(ip) in normal, None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return True


# ---- decisions (pure): the check and any future diagnose kind share them ----

REMEDY_ENV_FILE = (
    "Fix /etc/profile.d/nccl.sh on this node (the tutorial's step 3), then restart Ray and vLLM from a shell "
    "that sourced it."
)


def _finding(code: str, status: Status, message: str, subject: str, remedy: str | None = None) -> Finding:
    return Finding(code, status, message, subject, remedy=remedy)


def evaluate_nccl_env(
    values: dict[str, str],
    interfaces: dict[str, NetInterface],
    ib_ports: dict[str, dict[int, IbPort]],
    local_addresses: set[str] | None,
    *,
    require_debug: bool = True,
) -> list[Finding]:
    """Findings for the NCCL/GLOO/VLLM variables in ``values`` against this host's interfaces and HCAs."""
    findings: list[Finding] = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if var in values:
            findings += _check_ifname(var, values[var], interfaces)
        elif var == "NCCL_SOCKET_IFNAME":
            findings.append(
                _finding(
                    "NCCL_ENV_UNSET",
                    Status.WARNING,
                    "NCCL_SOCKET_IFNAME is not set: NCCL picks the control-plane interface itself and may pick "
                    "a docker bridge or the wrong network",
                    var,
                    REMEDY_ENV_FILE,
                )
            )
    selected_ports: list[IbPort] = []
    if "NCCL_IB_HCA" in values:
        hca_findings, selected_ports = _check_hca(values["NCCL_IB_HCA"], ib_ports)
        findings += hca_findings
    else:
        selected_ports = [p for ports in ib_ports.values() for p in ports.values()]
    if "NCCL_IB_GID_INDEX" in values:
        findings += _check_gid(values["NCCL_IB_GID_INDEX"], selected_ports)
    if HOST_IP_VAR in values and local_addresses is not None:
        local, error = is_local_address(values[HOST_IP_VAR], local_addresses)
        if error is not None:
            findings.append(
                _finding(
                    "NCCL_HOST_IP_INVALID", Status.CRITICAL, f"{HOST_IP_VAR}: {error}", HOST_IP_VAR, REMEDY_ENV_FILE
                )
            )
        elif not local:
            findings.append(
                _finding(
                    "NCCL_HOST_IP_NOT_LOCAL",
                    Status.CRITICAL,
                    f"{HOST_IP_VAR}={values[HOST_IP_VAR]} is not an address of this host (a copy of the other "
                    "node's file?)",
                    HOST_IP_VAR,
                    "Set VLLM_HOST_IP to this node's own business-network address (`ip -br addr`).",
                )
            )
    if require_debug and not values.get("NCCL_DEBUG"):
        findings.append(
            _finding(
                "NCCL_DEBUG_UNSET",
                Status.WARNING,
                "NCCL_DEBUG is not set: NCCL's own warnings will not reach the logs",
                "NCCL_DEBUG",
                "export NCCL_DEBUG=WARN (keep it on always; INFO only while reproducing a problem).",
            )
        )
    return findings


def _check_ifname(var: str, value: str, interfaces: dict[str, NetInterface]) -> list[Finding]:
    try:
        spec = parse_name_spec(value, allow_port=False)
    except SpecError as exc:
        return [_finding("NCCL_ENV_INVALID", Status.CRITICAL, f"{var}: {exc}", var, REMEDY_ENV_FILE)]
    findings: list[Finding] = []
    have = ", ".join(interfaces) or "none"
    if spec.exclude:
        selected = [i for i in interfaces.values() if not spec.matches(i.name)]
    else:
        selected = []
        for name, _port in spec.entries:
            one = NameSpec(False, spec.exact, ((name, None),))
            matched = [i for i in interfaces.values() if one.matches(i.name)]
            if not matched:
                findings.append(
                    _finding(
                        "NCCL_IFNAME_MISSING",
                        Status.CRITICAL,
                        f"{var}={value}: {'=' if spec.exact else ''}{name} matches no interface here (have: {have})",
                        var,
                        "Use this node's business interface name (`ip -br addr`); names differ between "
                        "machines (bond0, ens1f0np0, ...).",
                    )
                )
            selected += [i for i in matched if i not in selected]
    usable = [i for i in selected if not i.loopback]
    loop = [i.name for i in selected if i.loopback]
    if loop and (not spec.exclude or not usable):
        findings.append(
            _finding(
                "NCCL_IFNAME_LOOPBACK",
                Status.CRITICAL,
                f"{var}={value} selects loopback {', '.join(loop)}: the other node cannot reach it",
                var,
                "Name the business network interface, never lo.",
            )
        )
    # NCCL only uses interfaces that are up: with an exclusion list the down ones simply drop out.
    if spec.exclude and not any(i.up for i in usable):
        findings.append(
            _finding(
                "NCCL_IFNAME_MISSING",
                Status.CRITICAL,
                f"{var}={value} leaves no usable interface that is up (have: {have})",
                var,
                REMEDY_ENV_FILE,
            )
        )
    for iface in [] if spec.exclude else usable:
        if not iface.up:
            findings.append(
                _finding(
                    "NCCL_IFNAME_DOWN",
                    Status.WARNING,
                    f"{var} selects {iface.name}, which is {iface.operstate or 'not up'}",
                    iface.name,
                    f"Bring {iface.name} up (`ip link set {iface.name} up`) or check its cabling and bond.",
                )
            )
    return findings


def _check_hca(value: str, ib_ports: dict[str, dict[int, IbPort]]) -> tuple[list[Finding], list[IbPort]]:
    var = "NCCL_IB_HCA"
    try:
        spec = parse_name_spec(value, allow_port=True)
    except SpecError as exc:
        return [_finding("NCCL_ENV_INVALID", Status.CRITICAL, f"{var}: {exc}", var, REMEDY_ENV_FILE)], []
    findings: list[Finding] = []
    have = ", ".join(ib_ports) or "none"
    selected: list[IbPort] = []
    if spec.exclude:
        for dev, ports in ib_ports.items():
            if not spec.matches(dev):
                selected += ports.values()
        return findings, selected
    remedy = (
        "NCCL_IB_HCA must name devices that exist here (`ibdev2netdev`, `ls /sys/class/infiniband`); in a "
        "container, mount /dev/infiniband. Otherwise NCCL falls back to TCP sockets."
    )
    for name, port in spec.entries:
        one = NameSpec(False, spec.exact, ((name, None),))
        devices = [d for d in ib_ports if one.matches(d)]
        if not devices:
            findings.append(
                _finding(
                    "NCCL_IB_HCA_MISSING",
                    Status.CRITICAL,
                    f"{var}={value}: {name} matches no RDMA device here (have: {have})",
                    name,
                    remedy,
                )
            )
            continue
        for dev in devices:
            ports = ib_ports[dev]
            if port is None:
                selected += ports.values()
            elif port in ports:
                selected.append(ports[port])
            else:
                findings.append(
                    _finding(
                        "NCCL_IB_PORT_MISSING",
                        Status.CRITICAL,
                        f"{var}={value}: {dev} has no port {port} (ports: {', '.join(map(str, ports)) or 'none'})",
                        f"{dev}/{port}",
                        remedy,
                    )
                )
    return findings, selected


def _check_gid(value: str, ports: list[IbPort]) -> list[Finding]:
    var = "NCCL_IB_GID_INDEX"
    # isascii: str.isdigit() accepts "²", which int() refuses; a GID table has at most a few hundred entries.
    if not (value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 6):
        return [_finding("NCCL_ENV_INVALID", Status.CRITICAL, f"{var}={value!r} is not a number", var, REMEDY_ENV_FILE)]
    index = int(value)
    findings: list[Finding] = []
    for port in ports:
        subject = f"{port.device}/{port.port}"
        roce = (port.link_layer or "").lower() == "ethernet"
        gid = port.gids.get(index)
        if gid is None or gid_is_zero(gid):
            findings.append(
                _finding(
                    "NCCL_IB_GID_MISSING" if roce else "NCCL_IB_GID_INDEX_UNUSED",
                    # InfiniBand ports are addressed by LID inside a subnet: the index only matters when
                    # routing between subnets, so there it is a note, not a problem.
                    Status.CRITICAL if roce else Status.OK,
                    f"{var}={index}: {subject} has {'no' if gid is None else 'an all-zero'} GID at index {index}"
                    + ("" if roce else " (InfiniBand: unused within one subnet)"),
                    subject,
                    "Pick the index `show_gids` lists with this port's IPv4 address and type RoCE v2 (often 3); "
                    "an IP must be configured on the RoCE interface for that GID to exist.",
                )
            )
            continue
        gid_type = port.gid_types.get(index)
        findings.append(
            _finding(
                "NCCL_IB_GID_TYPE",
                Status.OK,
                f"{subject} GID {index} = {gid} ({gid_type or 'type unknown'}, link layer {port.link_layer or '?'})",
                subject,
            )
        )
        if roce and gid_type is not None and gid_type != "RoCE v2":
            findings.append(
                _finding(
                    "NCCL_IB_GID_NOT_ROCEV2",
                    Status.WARNING,
                    f"{var}={index}: {subject} is RoCE but GID {index} is {gid_type}, not RoCE v2 (routable)",
                    subject,
                    "Use the RoCE v2 GID index shown by `show_gids` for this port.",
                )
            )
    return findings


def compare_envs(
    file_values: dict[str, str], file_label: str, proc_values: dict[str, str], proc_label: str
) -> list[Finding]:
    """A watched variable that differs between the file and the running process: the process was started
    before the file changed (or without sourcing it)."""
    findings: list[Finding] = []
    a, b = watched(file_values), watched(proc_values)
    for var in sorted(set(a) | set(b)):
        if a.get(var) == b.get(var):
            continue
        left = repr(a[var]) if var in a else "unset"
        right = repr(b[var]) if var in b else "unset"
        findings.append(
            _finding(
                "NCCL_ENV_DRIFT",
                Status.WARNING,
                f"{var} is {left} in {file_label} but {right} in {proc_label}",
                var,
                "The process runs with other settings than the file: restart it from a shell that sourced the "
                "file (or fix whichever is wrong).",
            )
        )
    return findings


def env_facts(values: dict[str, str]) -> dict[str, str]:
    """``nccl_env.<VAR>`` facts for cross-node comparison; VLLM_HOST_IP differs per node by design, so it
    goes under ``host_ip`` where the comparison does not look."""
    facts = {f"nccl_env.{k}": v for k, v in sorted(watched(values).items()) if k != HOST_IP_VAR}
    if HOST_IP_VAR in values:
        facts["host_ip"] = values[HOST_IP_VAR]
    return facts

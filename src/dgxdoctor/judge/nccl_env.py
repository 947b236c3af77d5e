"""NCCL environment verdicts: the variables against this host's interfaces and HCAs, and file vs process.

References are in ``sources/nccl_env.py``, which only reads and parses.
"""

from __future__ import annotations

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.allowlist import env_allowed
from dgxdoctor.sources.nccl_env import (
    HOST_IP_VAR,
    NameSpec,
    NetInterface,
    SpecError,
    is_local_address,
    parse_name_spec,
    watched,
)
from dgxdoctor.sources.redact import digest, secret_name
from dgxdoctor.sources.sysfs_ib import IbPort, gid_is_zero

REMEDY_ENV_FILE = (
    "Fix /etc/profile.d/nccl.sh on this node (the tutorial's step 3), then restart Ray and vLLM from a shell "
    "that sourced it."
)


def _finding(code: str, status: Status, message: str, subject: str, remedy: str | None = None) -> Finding:
    return Finding(code, status, message, subject, remedy=remedy)


def evaluate_nccl_env(
    values: dict[str, str],
    interfaces: dict[str, NetInterface] | None,
    ib_ports: dict[str, dict[int, IbPort]],
    local_addresses: set[str] | None,
    *,
    require_debug: bool = True,
) -> list[Finding]:
    """Findings for the NCCL/GLOO/VLLM variables in ``values`` against this host's interfaces and HCAs.

    ``interfaces`` None: no source could list them (no /sys/class/net, no if_nameindex), so the interface
    variables are UNKNOWN, never "missing"."""
    findings: list[Finding] = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if var in values and interfaces is None:
            findings.append(
                _finding(
                    "NCCL_IFNAME_UNKNOWN",
                    Status.UNKNOWN,
                    f"{var}={values[var]} not checked: this host's interfaces cannot be listed (no /sys/class/net, "
                    "and the kernel's if_nameindex() did not answer)",
                    var,
                )
            )
        elif var in values:
            assert interfaces is not None
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
        findings += _check_host_ip(values[HOST_IP_VAR], local_addresses)
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


def _check_host_ip(value: str, local_addresses: set[str]) -> list[Finding]:
    local, error = is_local_address(value, local_addresses)
    if error is not None:
        return [
            _finding("NCCL_HOST_IP_INVALID", Status.CRITICAL, f"{HOST_IP_VAR}: {error}", HOST_IP_VAR, REMEDY_ENV_FILE)
        ]
    if local:
        return []
    return [
        _finding(
            "NCCL_HOST_IP_NOT_LOCAL",
            Status.CRITICAL,
            f"{HOST_IP_VAR}={value} is not an address of this host (a copy of the other node's file?)",
            HOST_IP_VAR,
            "Set VLLM_HOST_IP to this node's own business-network address (`ip -br addr`).",
        )
    ]


def _named_interfaces(
    var: str, value: str, spec: NameSpec, interfaces: dict[str, NetInterface]
) -> tuple[list[NetInterface], list[Finding]]:
    """The interfaces an inclusion list selects, and a finding for each name that matches none."""
    have = ", ".join(interfaces) or "none"
    selected: list[NetInterface] = []
    findings: list[Finding] = []
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
    return selected, findings


def _check_ifname(var: str, value: str, interfaces: dict[str, NetInterface]) -> list[Finding]:
    try:
        spec = parse_name_spec(value, allow_port=False)
    except SpecError as exc:
        return [_finding("NCCL_ENV_INVALID", Status.CRITICAL, f"{var}: {exc}", var, REMEDY_ENV_FILE)]
    have = ", ".join(interfaces) or "none"
    findings: list[Finding] = []
    if spec.exclude:
        selected = [i for i in interfaces.values() if not spec.matches(i.name)]
    else:
        selected, findings = _named_interfaces(var, value, spec, interfaces)
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
    # NCCL only uses interfaces that are up: with an exclusion list the down ones simply drop out (one whose state
    # is not known may be up).
    if spec.exclude and all(i.up is False for i in usable):
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
        if iface.up is False:
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


def shown_env(var: str, value: str) -> str:
    """The value as a message may quote it: itself for a harmless name, ``sha256:1a2b3c4d`` for any other."""
    return repr(value) if env_allowed(var) and not secret_name(var) else digest(value)


def compare_envs(
    file_values: dict[str, str], file_label: str, proc_values: dict[str, str], proc_label: str
) -> list[Finding]:
    """A watched variable that differs between the file and the running process: the process was started
    before the file changed (or without sourcing it). The values are compared whole; the message quotes a value
    only when its name is known to be harmless (``sources/allowlist.py``), else a short digest of it."""
    findings: list[Finding] = []
    a, b = watched(file_values), watched(proc_values)
    for var in sorted(set(a) | set(b)):
        if a.get(var) == b.get(var):
            continue
        left = shown_env(var, a[var]) if var in a else "unset"
        right = shown_env(var, b[var]) if var in b else "unset"
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

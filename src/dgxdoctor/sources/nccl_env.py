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
- if_nameindex(3): the kernel's own list of interface names (netlink), where /sys/class/net is not mounted.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.allowlist import env_allowed
from dgxdoctor.sources.redact import digest, secret_name

# A shell variable name: "NCCL_IB_HCA" in "export NCCL_IB_HCA=mlx5_0,mlx5_1".
VAR_NAME_RE = lazy_compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables whose values are node facts (compared across nodes) and whose drift between file and process matters.
WATCHED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_")
# Per-node by design (the tutorial: "只有 VLLM_HOST_IP 按本机 IP 改"): kept apart from the compared facts.
HOST_IP_VAR = "VLLM_HOST_IP"

ARPHRD_LOOPBACK = 772
IFF_UP = 0x1
IFF_LOOPBACK = 0x8


# The shipped /etc/profile.d/nccl.sh: "set -a; . /etc/nccl.env; set +a". allexport sets nothing by itself.
ALLEXPORT_LINES = frozenset({("set", "-a"), ("set", "+a"), ("set", "-o", "allexport"), ("set", "+o", "allexport")})
# ". /etc/nccl.env" or "source /etc/nccl.env": the file's variables are the sourced file's, read as data too.
SOURCE_COMMANDS = frozenset({".", "source"})
MAX_SOURCE_DEPTH = 4
# Files bigger than this are not an environment file.
MAX_ENV_FILE_BYTES = 1 << 20
# Longer than any real assignment (a long LD_LIBRARY_PATH is a few KiB); shlex spends seconds on a 200 KB line.
MAX_ENV_LINE_CHARS = 64 * 1024


class EnvFile(Struct, frozen=True):
    values: dict[str, str]
    # (line number, what is wrong) for lines that are not plain assignments; they are ignored, never run. What is
    # wrong is a kind, never the line's text: such a line may carry a secret (`[ -f x ] && export HF_TOKEN=...`),
    # and the problems are shown in /state and `check --json`.
    problems: tuple[tuple[int, str], ...] = ()
    # (line number, the file as resolved) for every file this one sources, nested ones included.
    sourced: tuple[tuple[int, str], ...] = ()


# The first word of a line that is not an assignment -> what the line is, as reported (its text never is).
LINE_KINDS = {".": "sources another file", "source": "sources another file", "set": "sets shell options"}
CONDITIONALS = frozenset({"if", "then", "else", "elif", "fi", "[", "[[", "test", "case", "esac", "for", "while"})


def line_kind(words: list[str]) -> str:
    """What a non-assignment line is, from its words only: "[ -f x ] && export A=b" is a conditional."""
    first = words[0] if words else ""
    if first in LINE_KINDS:
        return LINE_KINDS[first]
    if first in CONDITIONALS or any(w in ("&&", "||", ";") for w in words):
        return "a conditional or a command list"
    return "a command"


class EnvFileError(ValueError):
    """The file cannot be read as an environment file (too big, a loop of sources)."""


Include = Callable[[str], EnvFile]


def parse_env_file(text: str, include: Include | None = None) -> EnvFile:
    """Assignments of a profile.d-style file: ``export A=b``, ``A=b``, quotes, comments.

    ``. FILE`` / ``source FILE`` take FILE's assignments at that point when ``include`` reads it (``read_env_file``
    does); ``set -a``/``set +a`` are accepted. Anything else (commands, ``$(...)``, conditionals) is reported as a
    problem and ignored; values keep ``$VAR`` text unexpanded (the file is data here, never a script)."""
    values: dict[str, str] = {}
    problems: list[tuple[int, str]] = []
    sourced: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if len(stripped) > MAX_ENV_LINE_CHARS:
            problems.append((number, f"{len(stripped)} characters long (over {MAX_ENV_LINE_CHARS}), ignored"))
            continue
        try:
            words = shlex.split(stripped, comments=True, posix=True)
        except ValueError as exc:
            problems.append((number, f"cannot be split as shell words ({exc}), ignored"))
            continue
        if not words or tuple(words) in ALLEXPORT_LINES:
            continue
        if words[0] in SOURCE_COMMANDS and len(words) == 2:
            _include(number, words[1], include, values, problems, sourced)
            continue
        assignments = _assignments(words)
        if assignments is None:
            problems.append((number, f"not a plain assignment ({line_kind(words)}), ignored"))
            continue
        for name, value in assignments:
            if "$(" in value or "`" in value:
                problems.append((number, f"{name}: command substitution is not evaluated (value kept as text)"))
            values[name] = value
    return EnvFile(values, tuple(problems), tuple(sourced))


def _assignments(words: list[str]) -> list[tuple[str, str]] | None:
    """``export A=b C=d`` / ``A=b`` -> the pairs; None when the line is a command."""
    exported = words[0] == "export"
    if exported:
        words = words[1:]
    pairs: list[tuple[str, str]] = []
    for word in words:
        name, eq, value = word.partition("=")
        if eq and VAR_NAME_RE.match(name):
            pairs.append((name, value))
        elif not (exported and VAR_NAME_RE.match(word)):
            return None  # "export NAME" marks a variable and sets nothing; anything else is a command
    return pairs if (pairs or exported) else None


def _include(
    number: int,
    target: str,
    include: Include | None,
    values: dict[str, str],
    problems: list[tuple[int, str]],
    sourced: list[tuple[int, str]],
) -> None:
    if include is None:
        problems.append((number, f"sources {target}, which is not read here"))
        return
    if "$" in target or "`" in target:
        problems.append((number, f"sources {target}: the path is not evaluated"))
        return
    try:
        inner = include(target)
    except (OSError, EnvFileError) as exc:
        problems.append((number, f"sources {target}, which cannot be read: {exc}"))
        return
    sourced.append((number, target))
    sourced.extend((number, path) for _line, path in inner.sourced)
    problems.extend((number, f"in {target} line {line}: {problem}") for line, problem in inner.problems)
    values.update(inner.values)


def read_env_file(path: Path, host_root: Path = Path("/"), _depth: int = 0) -> EnvFile:
    """Read ``path`` as data and every file it sources, found under ``host_root`` (a test's copy of /).

    A relative sourced path is relative to the sourcing file's directory, as for a shell started there."""
    size = path.stat().st_size
    if size > MAX_ENV_FILE_BYTES:
        raise EnvFileError(f"{path} is {size} bytes: not an environment file")
    text = path.read_text(encoding="utf-8", errors="replace")

    def include(target: str) -> EnvFile:
        if _depth >= MAX_SOURCE_DEPTH:
            raise EnvFileError(f"more than {MAX_SOURCE_DEPTH} nested sources (a loop?)")
        resolved = host_root / target.lstrip("/") if target.startswith("/") else path.parent / target
        return read_env_file(resolved, host_root, _depth + 1)

    return parse_env_file(text, include)


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


class NameSpec(Struct, frozen=True):
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


class NetInterface(Struct, frozen=True):
    """One interface; ``type``, ``flags`` and ``operstate`` are None where only its name is known."""

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
    def up(self) -> bool | None:
        """None when nothing says (the kernel's name list carries no state)."""
        if self.operstate is not None and self.operstate != "unknown":
            return self.operstate == "up"
        if self.flags is None:
            return None
        return bool(self.flags & IFF_UP)


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


def kernel_interface_names() -> list[str]:
    """The kernel's own interface list (``socket.if_nameindex()``); raises OSError when it cannot be had."""
    return sorted(name for _, name in socket.if_nameindex())


def read_net_interfaces(
    sysfs_root: Path, kernel_names: Callable[[], Sequence[str]] = kernel_interface_names
) -> dict[str, NetInterface] | None:
    """This host's interfaces: from ``/sys/class/net`` (with type, flags, state) when it lists any, else the
    kernel's name list (state unknown); None when no source answers, so nothing reads as "missing"."""
    base = sysfs_root / "class" / "net"
    found: dict[str, NetInterface] = {}
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            found[entry.name] = NetInterface(
                entry.name,
                _int(_read(entry / "type")),
                _int(_read(entry / "flags"), 16),
                _read(entry / "operstate"),
            )
    if found:
        return found
    try:
        names = kernel_names()
    except OSError:
        return None
    return {name: NetInterface(name, None, None, None) for name in names} or None


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


def env_facts(values: dict[str, str]) -> dict[str, str]:
    """``nccl_env.<VAR>`` facts for cross-node comparison; VLLM_HOST_IP differs per node by design, so it
    goes under ``host_ip`` where the comparison does not look.

    Facts are labels of ``dgxdoctor_node_fact`` on the open ``/metrics``. Only the watched families are facts
    (NCCL_*, GLOO_*, TORCH_NCCL_*: interface and HCA names, GID index, levels: configuration both nodes must share,
    which the comparison needs), never the rest of vLLM's environment (HF_TOKEN and the like). A value is kept only
    when its name is known to be harmless (``allowlist.env_allowed``, not ``redact.secret_name``); any other
    (``NCCL_SECRET_X``, a plugin's variable) is kept as a short digest (``sha256:1a2b3c4d``), so two nodes can
    still be seen to differ, never the value."""
    facts = {
        f"nccl_env.{k}": v if env_allowed(k) and not secret_name(k) else digest(v)
        for k, v in sorted(watched(values).items())
        if k != HOST_IP_VAR
    }
    if HOST_IP_VAR in values:
        facts["host_ip"] = values[HOST_IP_VAR]
    return facts

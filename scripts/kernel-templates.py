#!/usr/bin/env python3
"""Regenerate src/dgxdoctor/data/kernel_templates.json: the kernel's own messages, at warning level and above, from
the files that print GPU-node faults, across kernel versions and NVIDIA's open kernel modules.

Each printk-family call (pr_err/pr_warn/pr_crit/pr_emerg/pr_alert, dev_*, pci_*, netdev_*, mlx5_core_*, mlx5_ib_*,
printk(KERN_*), WARN/WARN_ONCE, dev_printk/pci_printk/aer_printk with a computed level, and NVIDIA's
nv_printf/NV_DEV_PRINTF/NV_PRINTF at NV_DBG_ERRORS/LEVEL_ERROR or warnings) in FILES below gives one template: its
format (``pr_fmt``/``dev_fmt`` applied), a regex that matches the line it prints (placeholders bounded, the end
anchored, the start free for the dmesg stamp and the device prefix), its family, its printk level (0 emergency ..
4 warning; null where the caller computes it) and every ``version:path:line`` it was seen at. A format with fewer
than MIN_LITERAL letters of its own is left out (``"%s: %s\\n"`` names nothing) and counted.

Sources, any number of each:
  --tree  NAME@VERSION=DIR   an unpacked kernel source tree (only the FILES need be there)
  --git   NAME@TAG=GITDIR    a git directory, read at TAG with ``git show`` (no work tree needed)
  --git   NAME@VERSION=GITDIR#COMMIT[:FOLDER]
                             the same at a commit, for a repository without release tags whose commit holds one
                             release's tree (at its top, or in FOLDER); VERSION names it as its Makefile (and, for
                             a distribution's tree, its changelog) says

The committed table was built from (scripts/kernel-templates.sources lists the same arguments, one a line, and how
each source was had):
  Debian's source packages of three long-term kernels, unpacked with
  ``apt-get download linux-source-5.10=5.10.223-1 linux-source-6.1=6.1.176-1 linux-source-6.12=6.12.117-1`` (from
  bullseye, bookworm and trixie) and ``dpkg-deb --fsys-tarfile X.deb | tar -xO ./usr/src/linux-source-*.tar.xz |
  xz -dc | tar -x --strip-components=1``; the kernels GPU servers run besides, each read at the commit of a public
  repository that imported that release's tree whole (no later commit of it read): Linux 5.4.286, 6.2.12, 6.8.0,
  6.11.11 and 6.14.0, and Ubuntu's own 5.15.0-138.148 (jammy, 22.04) and 6.5.0-14.14+lenovo2 (mantic, a vendor's
  rebuild); and NVIDIA/open-gpu-kernel-modules at the release tags listed there (a bare clone). The table records
  each source's name, version and commit; the sources themselves are not kept.

    python3 scripts/kernel-templates.py --sources scripts/kernel-templates.sources \\
        --out src/dgxdoctor/data/kernel_templates.json

Standard library only; the sources' arguments, git reads and the write are scripts/template_sources.py's, shared
with scripts/signature-templates.py. tests/unit/test_kernel_templates.py loads the table, compiles every regex,
checks each family has a verdict (judge/kernel_families.py) and matches a real line of each family from a public
report.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from template_sources import git, git_show, parse_command_line, split_spec, write_table

FORM = "NAME@VERSION=PATH"
KINDS = ("tree", "git")

# File (a path, or a folder ending in /) -> family. Families are judged in src/dgxdoctor/judge/kernel_families.py.
FILES: dict[str, str] = {
    "drivers/net/ethernet/mellanox/mlx5/core/health.c": "mlx5",
    "drivers/net/ethernet/mellanox/mlx5/core/cmd.c": "mlx5",
    "drivers/net/ethernet/mellanox/mlx5/core/main.c": "mlx5",
    "drivers/net/ethernet/mellanox/mlx5/core/events.c": "mlx5",
    "drivers/net/ethernet/mellanox/mlx5/core/en_main.c": "mlx5",
    "drivers/infiniband/hw/mlx5/main.c": "mlx5",
    "drivers/net/bonding/bond_main.c": "bonding",
    "drivers/pci/pcie/aer.c": "aer",
    "drivers/pci/pcie/err.c": "aer",
    "arch/x86/kernel/cpu/mce/": "mce",
    "drivers/edac/edac_mc.c": "edac",
    "drivers/edac/sb_edac.c": "edac",
    "drivers/edac/skx_common.c": "edac",
    "drivers/edac/i10nm_base.c": "edac",
    "mm/memory-failure.c": "memory_failure",
    "drivers/acpi/apei/ghes.c": "ghes",
    "drivers/firmware/efi/cper.c": "ghes",
    "kernel/hung_task.c": "hung_task",
    "kernel/watchdog.c": "watchdog",
    "kernel/rcu/tree_stall.h": "rcu",
    "kernel/workqueue.c": "workqueue",
    "mm/oom_kill.c": "oom",
    "fs/nfs/": "nfs",
    "net/sunrpc/": "sunrpc",
    # NVIDIA's open kernel modules: the interface layer and the RM's unix entry points (init, probe, GPU lost).
    "kernel-open/nvidia/nv.c": "nvrm",
    "kernel-open/nvidia/nv-pci.c": "nvrm",
    "src/nvidia/arch/nvalloc/unix/src/osinit.c": "nvrm",
    "src/nvidia/arch/nvalloc/unix/src/osapi.c": "nvrm",
    "kernel-open/nvidia-peermem/nvidia-peermem.c": "peermem",
}
# Of NVIDIA's RM messages only those that say a GPU failed to initialise or was lost (the rest are Xids' or debug).
NVRM_KEEP = re.compile(r"(?i)\binit|probe|\bGSP\b|fallen off|\blost\b|not responding|firmware|\bfail")
MIN_LITERAL = 10  # letters and digits of the format's own text
ANY = r".{0,200}?"

# Call name -> (printk level, index of the format argument, index of a level argument or None); a level argument
# that is a KERN_* constant gives the level, one computed by the caller leaves it null. Suffixes _ratelimited/_once/
# _rl are the same call.
LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "warning": 4}
CALLS: dict[str, tuple[int | None, int, int | None]] = {}
for _name, _level in LEVELS.items():
    CALLS[f"pr_{_name}"] = (_level, 0, None)
    for _dev in ("dev", "pci", "netdev", "mlx5_core", "mlx5_ib", "ibdev"):
        CALLS[f"{_dev}_{_name}"] = (_level, 1, None)
    CALLS[f"netif_{_name}"] = (_level, 3, None)
CALLS.update({"WARN": (4, 1, None), "WARN_ONCE": (4, 1, None), "WARN_RATELIMIT": (4, 1, None)})
CALLS.update({"printk": (None, 0, None), "dev_printk": (None, 2, 0), "pci_printk": (None, 2, 0),
              "aer_printk": (None, 2, 0), "edac_printk": (None, 2, 0), "edac_mc_printk": (None, 2, 1),
              "edac_mc_chipset_printk": (None, 3, 1), "sbridge_printk": (None, 1, 0), "skx_printk": (None, 1, 0),
              "i10nm_printk": (None, 1, 0)})  # fmt: skip
CALLS.update({"nv_printf": (None, 1, 0), "NV_DEV_PRINTF": (None, 2, 0), "NV_PRINTF": (None, 1, 0)})
# Drivers' own wrappers, named here with the level their definition prints at.
CALLS.update({"peer_err": (3, 0, None)})
for _name, _level in LEVELS.items():  # bonding's "(slave %s): " forms, 5.x+
    CALLS[f"slave_{_name}"] = (_level, 2, None)
CALLS["printk_deferred"] = (None, 0, None)
NV_LEVELS = {"NV_DBG_ERRORS": 3, "LEVEL_ERROR": 3, "NV_DBG_WARNINGS": 4, "LEVEL_WARNING": 4}
KERN = {"KERN_EMERG": 0, "KERN_ALERT": 1, "KERN_CRIT": 2, "KERN_ERR": 3, "KERN_WARNING": 4, "KERN_NOTICE": 5,
        "KERN_INFO": 6, "KERN_DEBUG": 7, "KERN_CONT": 8, "KERN_DEFAULT": 8}  # fmt: skip
# Macros a format is built of, as they print.
MACROS = {"HW_ERR": "[Hardware Error]: ", "FW_BUG": "[Firmware Bug]: ", "FW_WARN": "[Firmware Warn]: ",
          "FW_INFO": "[Firmware Info]: ", "NV_PCI_DEV_FMT": "%04x:%02x:%02x.%x"}  # fmt: skip
SUFFIX = r"(?:_ratelimited|_once|_rl|_RATELIMIT)?"
CALL_RE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, CALLS), key=len, reverse=True)) + r")" + SUFFIX + r"\s*\(")
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
PRINTF = re.compile(r"%(?P<flags>[-+ #0]*)(?P<width>\*|\d+)?(?:\.(?:\*|\d+))?(?P<len>hh|h|ll|l|L|z|j|t)?"
                    r"(?P<conv>[diouxXeEfgGcsp%])(?P<ext>(?<=p)[A-Za-z0-9]*)?")  # fmt: skip
FMT_DEFINE = re.compile(r"#\s*define\s+(pr_fmt|dev_fmt)\s*\(\s*fmt\s*\)\s+(.*)")


@dataclass
class Template:
    family: str
    template: str
    regex: str
    level: int | None
    call: str
    origins: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)


def _args(text: str, start: int) -> list[str] | None:
    """The top-level arguments of the call whose '(' is at ``start - 1``; None when unbalanced within 3000 chars."""
    depth, args, current, i = 1, [], [], start
    while i < len(text) and i - start < 3000:
        c = text[i]
        if c == '"':
            end = i + 1
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            current.append(text[i : end + 1])
            i = end + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(current).strip())
                return args
        elif c == "," and depth == 1:
            args.append("".join(current).strip())
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    return None


def _format(arg: str) -> tuple[str, int | None] | None:
    """The format a format argument prints, and a KERN_* level it names; None when it holds no string literal."""
    if '"' not in arg:
        return None
    level = None
    out = []
    for token in re.findall(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_]\w*(?:\([^()]*\))?', arg):
        if token.startswith('"'):
            out.append(token[1:-1])
        elif token in KERN:
            level = KERN[token] if level is None else level
        elif token in MACROS:
            out.append(MACROS[token])
        elif token == "fmt" or token.startswith(("pr_fmt(", "dev_fmt(")):
            continue
        else:
            out.append("%s")  # a macro or variable whose text is not known here
    text = "".join(out)
    with contextlib.suppress(UnicodeDecodeError):  # a literal the codec cannot undo stays as written
        text = text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    return text, level


def _regex(fmt: str, ended: bool = True) -> str:
    parts, pos = [], 0
    for m in PRINTF.finditer(fmt):
        parts.append(_literal(fmt[pos : m.start()]))
        parts.append(_placeholder(m))
        pos = m.end()
    parts.append(_literal(fmt[pos:]))
    regex = "".join(parts).strip()
    while regex.startswith(ANY):  # a leading placeholder (a device or module name): the start is free anyway
        regex = re.sub(r"^(?::? \+|:)", "", regex[len(ANY) :])
    return regex + r"\s*$" if ended else regex


def _literal(text: str) -> str:
    return re.sub(" +", " +", re.escape(text))


def _placeholder(m: re.Match[str]) -> str:
    conv = m["conv"]
    if conv == "%":
        return "%"
    if conv in "di":
        return r"-?\d{1,20}"
    if conv == "u":
        return r"\d{1,20}"
    if conv in "xXo":
        return r"(?:0x)?[0-9a-fA-F]{1,16}"
    if conv in "eEfgG":
        return r"[-+0-9.eE]{1,30}"
    if conv == "c":
        return r"."
    return ANY  # %s, %p and its extensions: any text


def _literal_letters(fmt: str) -> int:
    return len(re.findall(r"[A-Za-z0-9]", PRINTF.sub("", fmt)))


def templates_of(source: str, path: str, family: str) -> Iterator[tuple[int, str, str, int | None, str]]:
    """(line, template, regex, level, call) of every printk-family call at warning level and above in a file."""
    fmts: dict[str, str] = {}
    for m in FMT_DEFINE.finditer(source):
        found = _format(m.group(2))
        if found is not None:
            fmts[m.group(1)] = found[0]
    for m in CALL_RE.finditer(source):
        name = m.group(1)
        level, index, level_arg = CALLS[name]
        head = source.rfind("\n", 0, m.start()) + 1
        if re.match(r"\s*#\s*define\b", source[head : m.start()]) or source[: max(head - 1, 0)].endswith("\\"):
            continue  # a macro's definition: its format is the macro's parameter, not a message
        args = _args(source, m.end())
        if args is None or len(args) <= index:
            continue
        if name in ("nv_printf", "NV_DEV_PRINTF", "NV_PRINTF"):
            level = NV_LEVELS.get(args[0].strip())
            if level is None:
                continue
        elif level_arg is not None:
            named = args[level_arg].strip()
            if named in KERN and KERN[named] > 4:
                continue
            level = KERN.get(named)
        fmt_arg = args[index]
        if name in ("WARN", "WARN_ONCE", "WARN_RATELIMIT") and '"' not in fmt_arg:
            continue
        found = _format(fmt_arg)
        if found is None:
            continue
        text, kern = found
        if name in ("printk", "printk_deferred"):
            # No KERN_* constant: the default level (4), unless the format opens with the caller's prefix, which
            # carries its level (cper.c's pfx): computed, null.
            computed = text.startswith("%s") and len(args) > 1 and re.search(r"(?i)pfx|prefix|level", args[1])
            level = kern if kern is not None else (None if computed else 4)
            if level is not None and level > 4:
                continue
        elif kern is not None and kern > 4:
            continue
        if level_arg is not None and kern is not None and name not in ("nv_printf", "NV_DEV_PRINTF", "NV_PRINTF"):
            level = kern
        prefix = fmts.get("pr_fmt", "") if name.startswith("pr_") else ""
        if name.startswith(("dev_", "pci_", "mlx5_core_")):
            prefix = fmts.get("dev_fmt", "")
        line = source.count("\n", 0, m.start()) + 1
        pieces = (prefix + text).split("\n")
        for number, piece in enumerate(pieces):
            piece = piece.strip()
            if _literal_letters(piece) < MIN_LITERAL:
                continue
            if family == "nvrm" and not NVRM_KEEP.search(piece):
                continue
            # A line the format ends is anchored at its end; one it leaves open (pr_cont follows) is not.
            yield line, piece, _regex(piece, ended=number < len(pieces) - 1), level, name


@dataclass(frozen=True)
class Source:
    kind: str  # tree, git
    name: str
    version: str
    path: Path
    rev: str | None = None  # git: the commit read (``COMMIT`` or ``COMMIT:SUBDIR``); None: the tag VERSION

    @classmethod
    def parse(cls, kind: str, text: str) -> Source:
        name, version, path = split_spec(kind, text, FORM)
        rev = None
        if kind == "git" and "#" in path:
            path, _, rev = path.rpartition("#")
        return cls(kind, name, version, Path(path), rev or None)

    def _at(self) -> tuple[str, str]:
        """The commit-ish to read and the folder of the tree within it ("" for the top)."""
        commit, _, subdir = (self.rev or self.version).partition(":")
        return commit, subdir.strip("/")

    def files(self) -> Iterator[tuple[str, str]]:
        if self.kind == "tree":
            for wanted in FILES:
                base = self.path / wanted
                paths = sorted(base.glob("*.[ch]")) if wanted.endswith("/") else [base]
                for p in paths:
                    if p.is_file():
                        yield str(p.relative_to(self.path)), p.read_text(encoding="utf-8", errors="replace")
            return
        commit, subdir = self._at()
        top = f"{commit}:{subdir}" if subdir else commit
        for name in git(self.path, "ls-tree", "-r", "--name-only", top).decode().splitlines():
            if any(name == w or (w.endswith("/") and name.startswith(w)) for w in FILES):
                shown = git_show(self.path, commit, f"{subdir}/{name}" if subdir else name)
                yield name, shown.decode("utf-8", errors="replace")

    def described(self) -> dict[str, str]:
        """What the table records of this source: its name, version, kind, and for git the commit (and folder)."""
        found: dict[str, str] = {"name": self.name, "version": self.version, "kind": self.kind}
        if self.kind != "git":
            return found
        commit, subdir = self._at()
        if sha := git(self.path, "rev-parse", f"{commit}^{{commit}}").decode().strip():
            found["commit"] = sha
        if subdir:
            found["folder"] = subdir
        return found


def family_of(path: str) -> str | None:
    for wanted, family in FILES.items():
        if path == wanted or (wanted.endswith("/") and path.startswith(wanted) and "/" not in path[len(wanted) :]):
            return family
    return None


def build(sources: list[Source]) -> dict[str, object]:
    table: dict[tuple[str, str], Template] = {}
    dropped = 0
    described = []
    for source in sources:
        described.append(source.described())
        for path, text in source.files():
            family = family_of(path)
            if family is None:
                continue
            before = len(CALL_RE.findall(text))
            kept = 0
            for line, template, regex, level, call in templates_of(text, path, family):
                kept += 1
                entry = table.setdefault((family, regex), Template(family, template, regex, level, call))
                where = f"{source.version}:{path}:{line}"
                if source.version not in entry.versions:
                    entry.versions.append(source.version)
                    entry.origins.append(where)
            dropped += max(0, before - kept)
    items = [
        {"family": t.family, "template": t.template, "regex": t.regex, "level": t.level, "call": t.call,
         "versions": t.versions, "origins": t.origins}
        for t in sorted(table.values(), key=lambda t: (t.family, t.template))
    ]  # fmt: skip
    return {
        "generated_by": "scripts/kernel-templates.py",
        "sources": described,
        "files": FILES,
        "calls_not_kept": dropped,
        "templates": items,
    }


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").split("\n\n")[0]
    sources, out = parse_command_line(description, KINDS, FORM, Source.parse, argv)
    table = build(sources)
    write_table(out, table)
    counts: dict[str, int] = {}
    for item in table["templates"]:  # type: ignore[attr-defined]
        counts[item["family"]] = counts.get(item["family"], 0) + 1
    print(json.dumps(counts, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What scripts/kernel-templates.py and scripts/signature-templates.py share: the sources they read, named
``NAME@VERSION=PATH`` after ``--KIND`` on the command line or one a line in a sources file (``$VARS`` expanded, ``#``
comments), git reads without a work tree, and the table written as indented JSON. Each script keeps its own walk
of a source's files (which files, how each is read). Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

S = TypeVar("S")


def split_spec(kind: str, text: str, form: str) -> tuple[str, str, str]:
    """(name, version, path) of ``NAME@VERSION=PATH``; ``form`` says the form in the error (``REPO@TAG=PATH``)."""
    spec, sep, path = text.partition("=")
    name, at, version = spec.partition("@")
    if not (sep and at and name and version and path):
        raise SystemExit(f"--{kind} {text!r}: want {form}")
    return name, version, path


def read_source_lines(path: Path, kinds: Sequence[str], form: str) -> list[tuple[str, str]]:
    """(kind, spec) of each ``--KIND SPEC`` line of a sources file."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            kind, _, text = os.path.expandvars(line.strip()).partition(" ")
            if kind.removeprefix("--") not in kinds:
                raise SystemExit(f"{path}: {line!r}: want {_either(kinds)} {form}")
            found.append((kind.removeprefix("--"), text.strip()))
    return found


def parse_command_line(
    description: str, kinds: Sequence[str], form: str, parse: Callable[[str, str], S], argv: list[str] | None
) -> tuple[list[S], Path]:
    """The sources (``--KIND`` arguments in the order of ``kinds``, then ``--sources FILE``'s lines) and ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    for kind in kinds:
        parser.add_argument(f"--{kind}", action="append", default=[], metavar=form)
    parser.add_argument("--sources", type=Path, help="a file of those arguments, one a line ($VARS expanded)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    sources = [parse(kind, text) for kind in kinds for text in getattr(args, kind)]
    if args.sources:
        sources += [parse(kind, text) for kind, text in read_source_lines(args.sources, kinds, form)]
    if not sources:
        parser.error(f"give at least one {_either(kinds)} source")
    return sources, args.out


def git(gitdir: Path, *args: str) -> bytes:
    """The output of a git command on a git directory (no work tree); empty where it fails."""
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], capture_output=True).stdout


def git_show(gitdir: Path, rev: str, path: str) -> bytes:
    """A file's content at a revision."""
    return git(gitdir, "show", f"{rev}:{path}")


def write_table(out: Path, table: dict[str, object]) -> None:
    out.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _either(kinds: Sequence[str]) -> str:
    flags = [f"--{kind}" for kind in kinds]
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " or " + flags[-1]

"""The interpreter the benchmarks measure: dgxdoctor as the README installs it, or one named with ``--python``.

    python3 -m venv /opt/dgxdoctor && /opt/dgxdoctor/bin/pip install .      # the README's install

The default (``--python installed``) is a virtual environment made by exactly that command from this checkout, no
extras, cached in ``.cache/installed-venv/`` (one per checkout, named by the hash of pyproject.toml: a changed
dependency list makes a new one). It is a real install, not an editable one: the modules byte-compiled by pip in
site-packages and the ``dgxdoctor`` console script, as on a node (an editable install imports from ``src`` through
a path hook and compiles at first start, which is not what runs in production). So when ``src`` changed since the
install, dgxdoctor alone is reinstalled (``pip install --no-deps --force-reinstall``, ~10 s); the dependencies
stay. pip builds from a copy of the checkout's files (tracked and untracked, not ignored), so no ``build/`` or
``egg-info`` is left in the checkout.

Building needs pip's index: it is built only when the index answers a TCP connect within 3 s (``PIP_INDEX_URL``,
else pip's configured ``index-url``, else pypi.org; ``PIP_NO_INDEX`` counts as none). Where none answers and no
up-to-date venv is cached (a machine without network, such as the H200 test machine), the running interpreter is
measured with the checkout's ``src`` first on ``PYTHONPATH``, exactly as ``--python`` would, and the first lines
printed say so. ``--python PATH`` measures PATH that way (the old way: e.g. the test venv, or a machine's own
``python3`` with its dependencies on ``PYTHONPATH``). Every run prints the interpreter, where dgxdoctor was
imported from and each installed distribution's version.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "installed-venv"
INSTALLED = "installed"
DEFAULT_INDEX = "https://pypi.org/simple"
# `pip config list`: "global.index-url='https://pypi.org/simple'" or ":env:.index-url='...'"
INDEX_URL_RE = re.compile(r"^\S*\.index-url='(?P<url>[^']+)'$", re.MULTILINE)


@dataclass(frozen=True)
class Product:
    """How to start dgxdoctor: ``installed`` (the console script of a README install, no PYTHONPATH) or an
    interpreter running the checkout's ``src``."""

    python: Path
    installed: bool
    why: str = ""

    def command(self, *args: str, flags: Iterable[str] = ()) -> list[str]:
        """argv of ``dgxdoctor ARGS`` as the operator types it; ``flags`` go to the interpreter (-X importtime)."""
        flags = list(flags)
        if self.installed:
            script = str(self.python.parent / "dgxdoctor")
            return [*([str(self.python), *flags, script] if flags else [script]), *args]
        return [str(self.python), *flags, "-m", "dgxdoctor", *args]

    def env(self) -> dict[str, str]:
        """The environment for the measured process: bytecode cached as after pip's install (no
        PYTHONDONTWRITEBYTECODE); installed: no PYTHONPATH at all; otherwise the checkout's src first."""
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("PYTHONPATH", None)
        if not self.installed:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
        return env

    def describe(self) -> str:
        """Which interpreter, where its dgxdoctor comes from, and every distribution's version there."""
        code = (
            "import sys, importlib.metadata as m, dgxdoctor\n"
            "print(sys.version.split()[0])\nprint(dgxdoctor.__file__)\n"
            "names = {d.metadata['Name'] + ' ' + d.version for d in m.distributions()}\n"
            "print(', '.join(sorted(names, key=str.lower)))\n"
        )
        done = subprocess.run([str(self.python), "-c", code], env=self.env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{self.python} cannot import dgxdoctor:\n{done.stderr}")
        version, origin, dists = done.stdout.splitlines()[:3]
        how = "installed as the README does (console script, no PYTHONPATH)" if self.installed else "PYTHONPATH=src"
        lines = [f"measured: {self.python} (Python {version}), {how}", f"  dgxdoctor from {origin}"]
        lines += [f"  why: {self.why}"] if self.why else []
        return "\n".join([*lines, f"  distributions: {dists}"])

    def version(self) -> str:
        done = subprocess.run([str(self.python), "-c", "import sys; print(sys.version.split()[0])"],
                              capture_output=True, text=True, env=self.env(), check=True)  # fmt: skip
        return done.stdout.strip()


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python", default=INSTALLED, metavar="PATH",
        help="interpreter to measure, with the checkout's src on PYTHONPATH (default 'installed': the README's "
        "install of this checkout in .cache/installed-venv, built where pip's index answers)",
    )  # fmt: skip


def resolve(choice: str, reachable: Callable[[], str | None] | None = None, venv: Path | None = None) -> Product:
    """The Product for ``--python CHOICE``; ``reachable`` returns None when pip's index answers, else why not;
    ``venv`` the cached install (default: this checkout's under .cache/installed-venv)."""
    if choice != INSTALLED:
        python = Path(shutil.which(choice) or choice)
        if not python.exists():
            raise SystemExit(f"--python {choice}: no such interpreter")
        return Product(python, installed=False)
    venv = venv or venv_dir()
    with _locked(venv.parent / f"{venv.name}.lock"):
        if _fresh(venv):
            return Product(venv / "bin" / "python", installed=True)
        unreachable = (reachable or index_unreachable)()
        if unreachable is not None:
            why = f"the installed venv cannot be built here ({unreachable}); this interpreter with src instead"
            return Product(Path(sys.executable), installed=False, why=why)
        build(venv)
    return Product(venv / "bin" / "python", installed=True)


def venv_dir() -> Path:
    """One venv per checkout and dependency list: the checkout's path and pyproject.toml hashed."""
    where = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    deps = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:12]
    return CACHE / f"{where}-{deps}"


def src_digest() -> str:
    """What the install was made from: every file under src (bytecode and egg-info aside) and pyproject.toml."""
    h = hashlib.sha256((REPO / "pyproject.toml").read_bytes())
    for path in sorted((REPO / "src").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not any(p.endswith(".egg-info") for p in path.parts):
            h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _fresh(venv: Path) -> bool:
    stamp = venv / "installed-from"
    return (venv / "bin" / "dgxdoctor").exists() and stamp.exists() and stamp.read_text().strip() == src_digest()


def index_unreachable(timeout: float = 3.0) -> str | None:
    """None when pip's index answers a TCP connect, else the reason."""
    if os.environ.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on"):
        return "PIP_NO_INDEX is set"
    url = os.environ.get("PIP_INDEX_URL") or _configured_index() or DEFAULT_INDEX
    parts = urlsplit(url)
    if parts.scheme == "file":
        return None
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"pip's index {url} does not answer: {exc}"
    return None


def _configured_index() -> str | None:
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    found = INDEX_URL_RE.search(done.stdout) if done.returncode == 0 else None
    return found["url"] if found else None


def build(venv: Path) -> None:
    """``python3 -m venv`` and ``pip install .`` of a copy of the checkout; dgxdoctor alone when the venv exists."""
    t0 = time.monotonic()
    fresh_venv = not (venv / "bin" / "pip").exists()
    if fresh_venv:
        for old in venv.parent.glob(venv.name.split("-")[0] + "-*"):  # this checkout's venvs of older deps
            if old.is_dir():
                shutil.rmtree(old)
        python3 = shutil.which("python3") or "python3"
        _run([python3, "-m", "venv", str(venv)])
    with tempfile.TemporaryDirectory(prefix="dgxdoctor-src-") as tmp:
        digest = src_digest()
        _copy_checkout(Path(tmp))
        extra = [] if fresh_venv else ["--no-deps", "--force-reinstall"]
        _run([str(venv / "bin" / "pip"), "install", "-q", *extra, tmp])
    (venv / "installed-from").write_text(digest + "\n")
    what = "built" if fresh_venv else "dgxdoctor reinstalled (src changed)"
    print(f"{venv}: {what} in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    )  # fmt: skip
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock, so two benchmark runs never build the same venv at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield

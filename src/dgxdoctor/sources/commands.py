"""Running external tools: argv lists only (never a shell), always with a timeout, from a fixed directory.

The agent runs as root. A tool started from whatever directory the operator (or systemd) happened to be in could
pick up files there: a Python interpreter imports ``platform.py`` from its current directory, and ``PYTHONPATH``
or a ``.pth`` in the user's site directory reach it too. So every command runs in ``WORKDIR``, and every Python the
agent starts goes through ``python_argv`` (isolated mode, ``-I``: no current or script directory on ``sys.path``, no
``PYTHON*`` environment variables, no user site directory).

This module is the only one that starts programs (``tests/unit/test_io_kit.py`` holds that): the checks, the
bundle and remediation's actions reach it through ``Environment.run_command`` / ``Environment.run_command_lines``,
so a test injects a runner instead of a real program.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from msgspec import Struct


class CommandResult(Struct, frozen=True):
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    # run_command_head: the program had more to print than the limit and was stopped there.
    cut: bool = False


class CommandNotFound(Exception):
    """The tool is not installed here (a check turns this into SKIPPED)."""


class CommandTimeout(Exception):
    pass


# A directory nobody but root can write to, present on every Linux system.
WORKDIR = "/"


def python_argv(python: str, *args: str) -> list[str]:
    """``python -I ARGS``: isolated mode for any interpreter the agent starts (see the module docstring)."""
    return [python, "-I", *args]


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], timeout_s: float = ...) -> CommandResult: ...


class HeadCommandRunner(Protocol):
    """A runner that keeps the first ``max_chars`` of stdout and stops the program there (bounded memory)."""

    def __call__(self, argv: Sequence[str], timeout_s: float, max_chars: int) -> CommandResult: ...


class LineCommandRunner(Protocol):
    """A runner that hands every line of stderr to ``on_stderr_line`` as it comes (a long probe's progress)."""

    def __call__(
        self, argv: Sequence[str], timeout_s: float, on_stderr_line: Callable[[str], None]
    ) -> CommandResult: ...


def _start(argv: Sequence[str], merge_stderr: bool = False) -> subprocess.Popen[str]:
    """The one place a program is started: argv (no shell), stdin closed, in ``WORKDIR``, output as text;
    with ``merge_stderr`` both streams in one pipe, in the order the program wrote them.

    Raises CommandNotFound when the program is absent (and OSError when it cannot be executed)."""
    if not argv:
        raise ValueError("empty argv")
    if shutil.which(argv[0]) is None:
        raise CommandNotFound(f"{argv[0]} not found in PATH")
    return subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        cwd=WORKDIR,
    )


def _timed_out(argv: Sequence[str], timeout_s: float) -> CommandTimeout:
    return CommandTimeout(f"{' '.join(argv)} did not finish in {timeout_s:g} s")


@contextmanager
def _deadline(proc: subprocess.Popen[str], argv: Sequence[str], timeout_s: float) -> Iterator[None]:
    """Kill ``proc`` at ``timeout_s`` while the body reads its pipes, then raise CommandTimeout; however the body
    ends, never leave the program running (a sink that raised must not wait for it either)."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
    if expired.is_set():
        raise _timed_out(argv, timeout_s)


def run_command(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
    """Run ``argv`` to its end and capture both pipes; past ``timeout_s`` it is killed and CommandTimeout raised.
    Raises CommandNotFound when the program is absent."""
    with _start(argv) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            # wait, not communicate (as subprocess.run does): a child it left behind (a daemon it started) may hold
            # the pipes open for ever.
            proc.wait()
            raise _timed_out(argv, timeout_s) from None
        except BaseException:
            proc.kill()
            raise
    return CommandResult(tuple(argv), proc.returncode, stdout, stderr)


def run_command_lines(argv: Sequence[str], timeout_s: float, on_stderr_line: Callable[[str], None]) -> CommandResult:
    """``run_command``, handing every line of stderr to ``on_stderr_line`` as it comes (a long probe's progress).

    stdout is drained by a thread so neither pipe fills; past ``timeout_s`` the program is killed and
    CommandTimeout raised, as in ``run_command``."""
    with _start(argv) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out: list[str] = []
        drain = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
        drain.start()
        err: list[str] = []
        with _deadline(proc, argv, timeout_s):
            for line in proc.stderr:
                err.append(line)
                on_stderr_line(line.rstrip("\n"))
            proc.wait()
            drain.join()
    return CommandResult(tuple(argv), proc.returncode, "".join(out), "".join(err))


# What is kept of the stderr of a program whose stdout is bounded (its error message).
STDERR_KEEP = 4096


def run_command_head(argv: Sequence[str], timeout_s: float, max_chars: int) -> CommandResult:
    """``run_command``, keeping the first ``max_chars`` characters of stdout: a program with more to print is
    killed there and the result says ``cut`` (its exit status is then the kill's). A reader of a log that may be
    large (``journalctl``) holds at most that much, whatever the program has to say."""
    return _run_head(argv, timeout_s, max_chars, merge_stderr=False)


def run_command_merged(argv: Sequence[str], timeout_s: float, max_chars: int) -> CommandResult:
    """``run_command_head`` with stderr in the same pipe as stdout (``docker logs`` prints the container's two
    streams on its own two; one pipe keeps their order). ``stderr`` of the result is empty."""
    return _run_head(argv, timeout_s, max_chars, merge_stderr=True)


def _run_head(argv: Sequence[str], timeout_s: float, max_chars: int, *, merge_stderr: bool) -> CommandResult:
    with _start(argv, merge_stderr) as proc:
        assert proc.stdout is not None
        err: list[str] = []
        stderr = proc.stderr

        def drain_stderr() -> None:  # read to its end (a full pipe would block the program), keep the start
            while stderr is not None and (chunk := stderr.read(STDERR_KEEP)):
                if not err:
                    err.append(chunk)

        drain = threading.Thread(target=drain_stderr, daemon=True)
        drain.start()
        with _deadline(proc, argv, timeout_s):
            out = proc.stdout.read(max_chars + 1)
            cut = len(out) > max_chars
            if cut:
                proc.kill()
                out = out[:max_chars]
            proc.wait()
            drain.join()
    return CommandResult(tuple(argv), proc.returncode, out, "".join(err)[:STDERR_KEEP], cut)

"""One I/O kit: every HTTP client, every program started and every atomic file write has one home.

HTTP clients come from ``Environment`` (a response cap in the transport, one TLS context); programs are started by
``sources/commands.py`` only (argv, timeout, in ``/``), reached through ``Environment.run_command`` and
``Environment.run_command_lines``; files are replaced by ``sources.statefile.atomic_write`` only.
"""

from __future__ import annotations

import ast
import asyncio
import errno
import stat
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from dgxdoctor.config import RemediationSettings
from dgxdoctor.environment import Environment
from dgxdoctor.fleet.cluster import NodeRun, ask_peers
from dgxdoctor.fleet.peers import MAX_STATE_BYTES, fetch_all
from dgxdoctor.remediation.actions import VllmTarget, run_argv
from dgxdoctor.remediation.engine import Remediator, Targets
from dgxdoctor.sources.commands import CommandResult
from dgxdoctor.sources.http import MAX_RESPONSE_BYTES
from dgxdoctor.sources.statefile import WRITE_ERRORS, StateFile, atomic_writer
from dgxdoctor.validation import validate

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"


@cache
def calls_and_imports(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, dotted name) of every ``a.b(...)`` call and every imported name in ``path`` (``httpx.Client``,
    ``subprocess``), parsed once for all the tests here."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if isinstance(node.func.value, ast.Name):
                out.append((node.lineno, f"{node.func.value.id}.{node.func.attr}"))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return tuple(out)


def found(names: set[str], allowed: set[str]) -> list[str]:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel not in allowed:
            hits += [f"{rel}:{line} {name}" for line, name in calls_and_imports(path) if name in names]
    return hits


# -- HTTP ------------------------------------------------------------------------------------------------------

HTTP_CLIENTS = {
    *("httpx.Client", "httpx.AsyncClient", "httpx.HTTPTransport", "httpx.AsyncHTTPTransport"),
    *("httpx.get", "httpx.post", "httpx.request", "httpx.stream"),  # each builds a client of its own
    *("httpx.create_ssl_context", "ssl.create_default_context"),  # one TLS context: environment.tls_context
}


def test_every_http_client_comes_from_the_environment() -> None:
    """A bare client has no response cap and builds its own TLS context (~20 ms of CPU each)."""
    assert found(HTTP_CLIENTS, {"environment.py"}) == []


class EndlessModels(BaseHTTPRequestHandler):
    """A vLLM gone wrong: healthy, then a ``/v1/models`` body far larger than any real one."""

    SENT_BYTES = 3 * MAX_RESPONSE_BYTES

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.path != "/v1/models":
            return
        chunk = b" " * 2**20
        try:
            for _ in range(self.SENT_BYTES // len(chunk)):
                self.wfile.write(chunk)
        except OSError:
            pass  # the client hung up at its cap

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def oversized_vllm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EndlessModels)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def true_runner(argv: object, timeout_s: float = 10.0) -> CommandResult:
    return CommandResult(("true",), 0, "", "")


def test_remediation_refuses_an_oversized_models_body(tmp_path: Path, oversized_vllm: str) -> None:
    """The restart's verification reads an untrusted ``/v1/models`` through the capped client: a clear error, and
    the agent holds at most the cap (the old bare client read all 96 MiB, twice over)."""
    settings = validate(
        RemediationSettings,
        {"mode": "act", "role": "head", "verify_timeout_s": 5, "commands": {"restart_vllm": ["true"]}},
    )
    targets = Targets(VllmTarget(oversized_vllm, "tiny"), "http://127.0.0.1:1", 1, 0, (), None)
    env = Environment(node="dgx-a", run_command=true_runner)
    r = Remediator(settings, None, "dgx-a", tmp_path, targets, dict, env=env)
    tracemalloc.start()
    try:
        steps = r._execute("restart_vllm", "0" * 12)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    verify = steps[-1]
    assert (verify.step, verify.ok) == ("verify", False)
    assert f"/v1/models: response larger than {MAX_RESPONSE_BYTES} bytes" in verify.detail
    assert peak < MAX_RESPONSE_BYTES + 16 * 2**20


# -- commands --------------------------------------------------------------------------------------------------

# The one module that starts programs, and what else may (each for a reason of its own).
STARTS_PROGRAMS = {
    "sources/commands.py",  # the runner: argv, timeout, stdin closed, in /
    # The all-reduce probe is itself a program the runner started, in the serving Python: it forks or spawns its
    # ranks (one per GPU) with multiprocessing, as torch.distributed's own launchers do. Nothing of the agent.
    "probes/allreduce.py",
}
PROGRAM_STARTERS = {
    "subprocess",
    "multiprocessing",
    *(f"subprocess.{name}" for name in ("run", "Popen", "call", "check_call", "check_output", "getoutput")),
    *(f"os.{name}" for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp")),
    *(f"os.{name}" for name in ("execv", "execve", "execvp", "execvpe", "execl", "execlp", "spawnv", "spawnvp")),
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
    "pty.spawn",
}


def test_only_the_runner_starts_programs() -> None:
    assert found(PROGRAM_STARTERS, STARTS_PROGRAMS) == []


PRINT_CWD = [sys.executable, "-c", "import os, sys; print(os.getcwd()); print(os.getcwd(), file=sys.stderr)"]


def test_every_runner_starts_programs_in_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's commands run in ``/``, whatever directory the agent was started from (they printed it before)."""
    monkeypatch.chdir(tmp_path)
    env = Environment()
    assert env.run_command(PRINT_CWD, timeout_s=30).stdout == "/\n"
    lines: list[str] = []
    streamed = env.run_command_lines(PRINT_CWD, 30, lines.append)
    assert (streamed.stdout, lines) == ("/\n", ["/"])
    step = run_argv("restart_vllm", PRINT_CWD, 30, env.run_command)
    assert (step.ok, step.detail) == (True, "exit 0: /\n/")


def test_the_nccl_probe_streams_through_the_injected_runner(tmp_path: Path) -> None:
    from dgxdoctor.checks.nccl import NcclCheck, NcclSettings

    asked: list[list[str]] = []

    def lines(argv: object, timeout_s: float, on_stderr_line: object) -> CommandResult:
        asked.append(list(argv))  # type: ignore[call-overload]
        return CommandResult(tuple(asked[-1]), 0, "table", "")

    check = NcclCheck(NcclSettings(), Environment(state_dir=tmp_path, run_command_lines=lines))
    check.attach_progress(lambda line: None)
    run = check.run_local([sys.executable, "-c", "pass"], None)
    assert (asked, run.stdout) == ([[sys.executable, "-c", "pass"]], "table")


# -- files -----------------------------------------------------------------------------------------------------

# Replacing a file by hand (a temporary file renamed over it) is atomic_writer's job alone: the others had no fsync.
# (A scratch tempfile.TemporaryDirectory, the bench's and the bug report's, replaces nothing.)
FILE_REPLACERS = {"os.replace", "os.rename", "shutil.move", "tempfile.mkstemp", "tempfile.NamedTemporaryFile"}


def test_only_the_atomic_writer_replaces_files() -> None:
    assert found(FILE_REPLACERS, {"sources/statefile.py"}) == []


def definitions(name: str) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if name in path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name
    ]


@pytest.mark.parametrize("name", ["StateFile", "atomic_writer", "atomic_write"])
def test_one_definition_of_each_file_writer(name: str) -> None:
    assert len(definitions(name)) == 1, definitions(name)


class DiskFull(OSError):
    def __init__(self) -> None:
        super().__init__(errno.ENOSPC, "No space left on device")


def test_a_failed_write_is_raised_and_leaves_the_target_untouched(tmp_path: Path) -> None:
    """ENOSPC in the middle of an archive (what a full disk does to the tar stream): raised, the old file whole,
    no temporary file left behind."""
    target = tmp_path / "bundle.tar.gz"
    target.write_bytes(b"the old archive")
    with pytest.raises(DiskFull), atomic_writer(target) as fh:
        fh.write(b"half of the new")
        raise DiskFull
    assert target.read_bytes() == b"the old archive"
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.tar.gz"]


def test_a_state_file_that_cannot_be_written_raises_or_is_counted(tmp_path: Path) -> None:
    """``write`` raises (remediation stops); ``save`` answers False and counts it (a check goes on)."""
    blocked = tmp_path / "state"
    blocked.write_text("a file where the state directory should be")
    state = StateFile(blocked / "guard.json")
    with pytest.raises(OSError):
        state.write({"a": 1})
    before = WRITE_ERRORS["guard.json"]
    assert state.save({"a": 1}) is False
    assert WRITE_ERRORS["guard.json"] == before + 1
    assert blocked.read_text() == "a file where the state directory should be"


def test_the_probe_output_that_cannot_be_kept_is_counted(tmp_path: Path) -> None:
    """It was dropped silently (``except OSError: pass``); now it is in dgxdoctor_write_errors_total."""
    from dgxdoctor.checks.nccl import NcclCheck, NcclSettings

    (tmp_path / "nccl").write_text("a file where the probe's folder should be")
    before = WRITE_ERRORS["last-probe.txt"]
    NcclCheck(NcclSettings(), Environment(state_dir=tmp_path)).keep_output(None, "table", "")
    assert WRITE_ERRORS["last-probe.txt"] == before + 1


def test_the_bench_baseline_and_a_bundle_are_written_whole(tmp_path: Path) -> None:
    """Both go through the atomic writer now (mode set, fsynced), and nothing else is left in the folder."""
    from dgxdoctor.bundle.archive import write_bundle
    from dgxdoctor.bundle.collect import Part

    size = write_bundle(tmp_path / "b.tar.gz", [Part("dgx-a", [("x.txt", b"x")], {"files": []})], {"nodes": 1})
    assert size == (tmp_path / "b.tar.gz").stat().st_size > 0
    assert stat.S_IMODE((tmp_path / "b.tar.gz").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar.gz"]


# -- the peer exchange -----------------------------------------------------------------------------------------

BAD_ANSWERS = {
    "token": lambda: httpx.Response(401, json={"error": "missing or wrong token"}),
    "document": lambda: httpx.Response(200, json={"node": "dgx-b", "checks": [{"samples": []}]}),
    "size": lambda: httpx.Response(200, content=b" " * (MAX_STATE_BYTES + 1)),
}


@pytest.mark.parametrize("bad", sorted(BAD_ANSWERS))
def test_both_ways_of_asking_a_peer_word_a_bad_answer_alike(bad: str) -> None:
    """The comparison's ``GET /state`` and ``check --cluster`` read peers through one exchange (they had two, and
    worded the same 401 or the same bad field differently: ``checks[0].name`` here, ``checks.0.name`` there)."""
    env = Environment(http_transport=httpx.MockTransport(lambda request: BAD_ANSWERS[bad]()))
    fetched = fetch_all(lambda: env.async_http_client(), ["http://dgx-b:9835"], "t" * 16, 5.0)[0]

    async def ask() -> NodeRun:
        async with env.async_http_client() as client:
            return (await ask_peers(client, ["http://dgx-b:9835"], "t" * 16, 5.0, cached=True))[0]

    asked = asyncio.run(ask())
    assert fetched.error is not None and asked.error is not None
    assert fetched.error.removeprefix("invalid /state: ") == asked.error.removeprefix("BadAnswer: ")


def test_a_bundle_part_refused_for_its_token_says_so() -> None:
    """The bundle's ``POST /bundle/part`` is read through the same exchange (it said only "HTTP 401")."""
    from dgxdoctor.bundle.build import ask_part
    from dgxdoctor.bundle.redact import Redactor

    env = Environment(http_transport=httpx.MockTransport(lambda request: BAD_ANSWERS["token"]()))

    async def ask() -> str | None:
        async with env.async_http_client() as client:
            return (await ask_part(client, "http://dgx-b:9835", "t" * 16, 900, 5.0, Redactor(), 2**20)).error

    error = asyncio.run(ask())
    assert error is not None and "token rejected" in error and "missing or wrong token" in error


# -- the gated peer requests -----------------------------------------------------------------------------------

GATE_PARTS = {"json.loads", "math.isfinite", "dgxdoctor.daemon.connections.lift_deadline"}


@pytest.mark.parametrize("handler", ["daemon/checknow.py", "daemon/bundle_part.py"])
def test_the_expensive_peer_requests_share_one_gate(handler: str) -> None:
    """``POST /check/run`` and ``POST /bundle/part`` parse their body, gate and lift the deadline in
    ``daemon/gated.py`` (each had its own copy)."""
    assert [name for _, name in calls_and_imports(PACKAGE / handler) if name in GATE_PARTS] == []


def test_both_gated_requests_refuse_a_bad_body_alike() -> None:
    from dgxdoctor.config import parse_config
    from dgxdoctor.daemon.bundle_part import parse_request
    from dgxdoctor.daemon.checknow import parse_deadline

    config = parse_config({})
    for body, problem in ((b"[]", "Expected `object`"), (b'{"deadline_s": "9"}', r"got `str` - at `\$.deadline_s`")):
        with pytest.raises(ValueError, match=problem):
            parse_deadline(body)
        with pytest.raises(ValueError, match=problem):
            parse_request(body, config)

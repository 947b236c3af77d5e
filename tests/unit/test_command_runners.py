"""The three bounded runners of sources/commands.py against real programs: a program past its deadline is killed
and CommandTimeout raised; a sink that raises leaves no program running; a head-bounded reader stops the program."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from dgxdoctor.sources.commands import (
    CommandTimeout,
    run_command,
    run_command_head,
    run_command_lines,
    run_command_merged,
)

# Prints its own pid first, so a test can tell whether the program still runs after the runner returned.
SLEEPER = ["sh", "-c", "echo $$ >&2; echo $$; exec sleep 30"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone too: its parent has not reaped it yet
        return fh.read().split(") ", 1)[1].startswith("Z")


@pytest.mark.parametrize(
    "run",
    [
        lambda: run_command(SLEEPER, 0.5),
        lambda: run_command_head(SLEEPER, 0.5, 1000),
        lambda: run_command_merged(SLEEPER, 0.5, 1000),
        lambda: run_command_lines(SLEEPER, 0.5, lambda line: None),
    ],
    ids=["plain", "head", "merged", "lines"],
)
def test_every_runner_kills_a_program_past_its_deadline(run: Callable[[], object]) -> None:
    with pytest.raises(CommandTimeout, match=r"did not finish in 0\.5 s"):
        run()


def test_a_sink_that_raises_leaves_no_program_running() -> None:
    pids: list[int] = []

    def sink(line: str) -> None:
        pids.append(int(line))
        raise RuntimeError("sink failed")

    with pytest.raises(RuntimeError, match="sink failed"):
        run_command_lines(SLEEPER, 30, sink)
    assert pids and _gone(pids[0])


def test_the_head_reader_stops_a_program_with_more_to_say() -> None:
    result = run_command_head(["yes", "line"], 10, 100)
    assert result.cut and result.stdout == "line\n" * 20
    merged = run_command_merged(["sh", "-c", "echo out; echo err >&2"], 10, 100)
    assert not merged.cut and sorted(merged.stdout.split()) == ["err", "out"] and merged.stderr == ""

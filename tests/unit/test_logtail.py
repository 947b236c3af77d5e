"""Incremental log reading: first sight, partial lines, rotation, truncation, budget, binary garbage."""

from __future__ import annotations

import os
from pathlib import Path

from dgxdoctor.sources.logtail import LogFollower, expand_paths


def lines(result: list[tuple[str, str]]) -> list[str]:
    return [line for _, line in result]


def test_first_sight_starts_at_end_unless_from_start(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("old 1\nold 2\n")
    follower = LogFollower()
    assert follower.poll([str(log)], 1 << 20).lines == []
    with log.open("a") as fh:
        fh.write("new\n")
    assert lines(follower.poll([str(log)], 1 << 20).lines) == ["new"]
    assert lines(LogFollower(from_start=True).poll([str(log)], 1 << 20).lines) == ["old 1", "old 2", "new"]


def test_file_appearing_after_first_poll_is_read_from_start(tmp_path: Path) -> None:
    follower = LogFollower()
    pattern = str(tmp_path / "*.err")
    (tmp_path / "worker-1.err").write_text("history\n")
    assert follower.poll(expand_paths([pattern]), 1 << 20).lines == []
    (tmp_path / "worker-2.err").write_text("RuntimeError: CUDA error: out of memory\n")
    result = follower.poll(expand_paths([pattern]), 1 << 20)
    assert result.lines == [(str(tmp_path / "worker-2.err"), "RuntimeError: CUDA error: out of memory")]


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("")
    follower = LogFollower()
    follower.poll([str(log)], 1 << 20)
    with log.open("a") as fh:
        fh.write("complete\nhalf a li")
    assert lines(follower.poll([str(log)], 1 << 20).lines) == ["complete"]
    with log.open("a") as fh:
        fh.write("ne\n")
    assert lines(follower.poll([str(log)], 1 << 20).lines) == ["half a line"]


def test_state_survives_a_restart(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("seen\n")
    first = LogFollower()
    first.poll([str(log)], 1 << 20)
    with log.open("a") as fh:
        fh.write("after restart\n")
    second = LogFollower(first.state())
    assert lines(second.poll([str(log)], 1 << 20).lines) == ["after restart"]


def test_rotation_finishes_old_file_then_reads_new_from_start(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("before\n")
    follower = LogFollower()
    follower.poll([str(log)], 1 << 20)
    with log.open("a") as fh:
        fh.write("tail of old\n")
    os.rename(log, tmp_path / "vllm.log.1")  # logrotate: rename, then create
    log.write_text("first of new\n")
    result = follower.poll([str(log)], 1 << 20)
    assert result.rotated == [str(log)]
    assert result.lines == [(str(log) + ".1", "tail of old"), (str(log), "first of new")]


def test_rotation_without_rotated_copy_reads_new_file(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("x\n")
    follower = LogFollower()
    follower.poll([str(log)], 1 << 20)
    log.unlink()
    log.write_text("fresh\n")
    assert lines(follower.poll([str(log)], 1 << 20).lines) == ["fresh"]


def test_truncation_restarts_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("a fairly long line that was there\n")
    follower = LogFollower()
    follower.poll([str(log)], 1 << 20)
    with log.open("r+") as fh:  # copytruncate keeps the inode
        fh.truncate(0)
    with log.open("a") as fh:
        fh.write("short\n")
    result = follower.poll([str(log)], 1 << 20)
    assert result.truncated == [str(log)]
    assert lines(result.lines) == ["short"]


def test_budget_splits_reading_across_polls(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("")
    follower = LogFollower()
    follower.poll([str(log)], 100)
    log.write_text("".join(f"line {i:03d}\n" for i in range(10)))  # 9 bytes each
    first = follower.poll([str(log)], 30)
    assert lines(first.lines) == ["line 000", "line 001", "line 002"]
    assert first.budget_exhausted
    second = follower.poll([str(log)], 1000)
    assert lines(second.lines) == [f"line {i:03d}" for i in range(3, 10)]


def test_overlong_line_is_cut_rather_than_stalling(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("")
    follower = LogFollower()
    follower.poll([str(log)], 100)
    log.write_text("x" * 50 + "\nnext\n")
    assert lines(follower.poll([str(log)], 20).lines) == ["x" * 20]
    assert lines(follower.poll([str(log)], 1000).lines) == ["x" * 30, "next"]


def test_binary_garbage_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"")
    follower = LogFollower()
    follower.poll([str(log)], 100)
    log.write_bytes(b"\xff\xfe\x00 CUDA out of memory\n")
    (line,) = lines(follower.poll([str(log)], 100).lines)
    assert "\ufffd" in line and "CUDA out of memory" in line


def test_corrupt_state_entries_are_ignored(tmp_path: Path) -> None:
    follower = LogFollower({"/x": {"dev": "a"}, "/y": [], "/z": {"dev": 1, "ino": 2, "offset": -5}})
    assert follower.state() == {}


def test_expand_paths_globs_and_missing(tmp_path: Path) -> None:
    (tmp_path / "a.err").write_text("")
    (tmp_path / "b.out").write_text("")
    (tmp_path / "sub").mkdir()
    found = expand_paths([str(tmp_path / "*.err"), str(tmp_path / "*.out"), str(tmp_path / "missing.log")])
    assert found == [str(tmp_path / "a.err"), str(tmp_path / "b.out")]

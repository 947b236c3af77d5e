"""dgxdoctor.compat: on every supported Python, a deadline raises the builtin ``TimeoutError`` (on 3.10
``asyncio.TimeoutError`` is another class, which ``except TimeoutError`` misses), a lifted deadline never fires, and
the TOML parser is the standard library's or its backport."""

from __future__ import annotations

import asyncio

import pytest

from dgxdoctor.compat import aio, tomllib


async def test_timeout_raises_the_builtin_timeout_error() -> None:
    with pytest.raises(TimeoutError) as info:
        async with aio.timeout(0.01):
            await asyncio.sleep(5)
    assert type(info.value) is TimeoutError or not issubclass(asyncio.TimeoutError, TimeoutError)


async def test_wait_for_raises_the_builtin_timeout_error() -> None:
    with pytest.raises(TimeoutError):
        await aio.wait_for(asyncio.Event().wait(), 0.01)
    assert await aio.wait_for(asyncio.sleep(0, "done"), 1) == "done"


async def test_a_lifted_deadline_never_fires() -> None:
    """``lift_deadline`` (daemon.connections) reschedules the request's deadline to None."""
    done = []
    async with aio.timeout(0.02) as deadline:
        deadline.reschedule(None)
        await asyncio.sleep(0.05)
        done.append("slept past the old deadline")
    done.append("left the block")
    assert done == ["slept past the old deadline", "left the block"]


async def test_an_outside_cancel_stays_a_cancel() -> None:
    async def guarded() -> None:
        async with aio.timeout(5):
            await asyncio.sleep(5)

    task = asyncio.create_task(guarded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_toml_parser_reads_and_names_a_syntax_error() -> None:
    assert tomllib.loads('[daemon]\nlisten = "0.0.0.0:9835"\n') == {"daemon": {"listen": "0.0.0.0:9835"}}
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads("[daemon\n")


async def test_a_deadline_rescheduled_later_fires_then() -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError):
        async with aio.timeout(0.01) as deadline:
            deadline.reschedule(loop.time() + 0.1)
            await asyncio.sleep(5)
    assert loop.time() - t0 >= 0.09

"""``asyncio.timeout`` and ``asyncio.wait_for`` that raise the builtin ``TimeoutError`` on every Python.

On 3.11+ these are asyncio's own. On 3.10 ``asyncio.TimeoutError`` is a separate class that ``except TimeoutError``
does not catch, and there is no ``asyncio.timeout``: the backport ``async-timeout`` (a conditional dependency,
aiohttp's own) keeps the deadline, its ``asyncio.TimeoutError`` is raised here as the builtin, and the deadline it
yields answers ``reschedule(when)`` as ``asyncio.Timeout`` does (``None``: no deadline).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

T = TypeVar("T")

if sys.version_info >= (3, 11):
    from asyncio import timeout, wait_for
else:
    import async_timeout

    class _Deadline:
        """``asyncio.Timeout.reschedule`` over async-timeout's ``update`` and ``reject``."""

        def __init__(self, held: async_timeout.Timeout) -> None:
            self._held = held

        def reschedule(self, when: float | None) -> None:
            if when is None:
                self._held.reject()
            else:
                self._held.update(when)

    @asynccontextmanager
    async def timeout(delay: float | None) -> AsyncIterator[_Deadline]:
        """A deadline ``delay`` seconds from now (None: none until rescheduled)."""
        try:
            async with async_timeout.timeout(delay) as held:
                yield _Deadline(held)
        except asyncio.TimeoutError as exc:
            raise TimeoutError from exc

    async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
        try:
            return await asyncio.wait_for(awaitable, timeout)
        except asyncio.TimeoutError as exc:
            raise TimeoutError from exc


__all__ = ["timeout", "wait_for"]

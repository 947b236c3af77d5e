"""The Check protocol, its settings base, and the one runner that times, guards and records every run."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import replace
from typing import ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from dgxdoctor.environment import Environment
from dgxdoctor.result import CheckResult
from dgxdoctor.sources.http import AgentExhausted, own_exhaustion


class CheckSettings(BaseModel):
    """Keys every ``[checks.<name>]`` table has. Subclasses add their own and may change the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="run this check")
    interval_s: float = Field(30.0, gt=0, description="daemon: seconds between runs")
    timeout_s: float = Field(20.0, gt=0, description="a run that takes longer is UNKNOWN")


class Check(Protocol):
    """A check has a stable snake_case ``name`` and a blocking ``run`` that may raise.

    Construct with ``(settings, env)``. Instances live as long as the process, so a check may keep
    history between runs (rates, windows) on ``self``.
    """

    name: ClassVar[str]
    settings_model: ClassVar[type[CheckSettings]]
    settings: CheckSettings

    def run(self) -> CheckResult: ...


class CheckFactory(Protocol):
    """A check class. Read-only properties here: mypy never matches a ClassVar protocol member to a class."""

    @property
    def name(self) -> str: ...

    @property
    def settings_model(self) -> type[CheckSettings]: ...

    def __call__(self, settings: CheckSettings, env: Environment) -> Check: ...


class CheckRunner:
    """Runs checks off the event loop with a timeout; any exception or timeout becomes UNKNOWN.

    A thread stuck in a hung call (NVML when a GPU fell off the bus) cannot be killed. The runner
    remembers it and does not start a second one; later runs report the hang until it returns.
    """

    def __init__(self, env: Environment) -> None:
        self._env = env
        self._hung: dict[str, threading.Thread] = {}
        self.timeouts_total: dict[str, int] = {}

    async def run(self, check: Check) -> CheckResult:
        name = check.name
        started_at = self._env.clock()
        t0 = time.monotonic()
        stuck = self._hung.get(name)
        if stuck is not None and stuck.is_alive():
            return replace(
                CheckResult.unknown(name, f"previous run has not returned after timing out ({name} is hung)"),
                started_at=started_at,
            )
        self._hung.pop(name, None)

        loop = asyncio.get_running_loop()
        future: asyncio.Future[CheckResult] = loop.create_future()

        def work() -> None:
            outcome: CheckResult | None = None
            error: BaseException | None = None
            try:
                outcome = check.run()
            except BaseException as exc:  # every failure becomes UNKNOWN
                error = exc
            # A run that returns after its timeout may find the loop gone (one-shot `check` has exited).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, outcome, error)

        # A daemon thread per run (not a pool): a hung call must not eat a shared worker forever.
        thread = threading.Thread(target=work, name=f"check-{name}", daemon=True)
        thread.start()
        timeout = check.settings.timeout_s
        try:
            result = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            self._hung[name] = thread
            self.timeouts_total[name] = self.timeouts_total.get(name, 0) + 1
            result = CheckResult.unknown(name, f"{name} did not answer in {timeout:g} s")
        except Exception as exc:
            what = own_exhaustion(exc)
            if what is not None and not isinstance(exc, AgentExhausted):
                exc = AgentExhausted(f"dgxdoctor itself is out of {what} ({exc})")
            result = CheckResult.unknown(name, f"{type(exc).__name__}: {exc}")
        if result.check != name:
            result = replace(result, check=name)
        return replace(result, started_at=started_at, duration_s=time.monotonic() - t0)

    async def run_all(self, checks: list[Check]) -> list[CheckResult]:
        return list(await asyncio.gather(*(self.run(c) for c in checks)))


def _settle(future: asyncio.Future[CheckResult], result: CheckResult | None, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
    else:
        assert result is not None
        future.set_result(result)

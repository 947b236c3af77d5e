"""The Check protocol, its settings base, and the one runner that times, guards and records every run."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Generic, Protocol, cast, get_args, get_origin

from msgspec import Meta
from msgspec.structs import replace
from typing_extensions import TypeVar

from dgxdoctor import eventlog
from dgxdoctor.environment import Environment
from dgxdoctor.judge.consequence import judged_result
from dgxdoctor.result import CheckResult, Sample
from dgxdoctor.settings.base import Frozen
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.exhaustion import AgentExhausted, own_exhaustion

log = eventlog.get_logger(__name__)


class CheckSettings(Frozen, frozen=True):
    """Keys every ``[checks.<name>]`` table has. Subclasses add their own and may change the defaults."""

    enabled: Annotated[bool, Meta(description="run this check")] = True
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 30.0
    timeout_s: Annotated[float, Meta(gt=0, le=DAY_S, description="a run that takes longer is UNKNOWN")] = 20.0


# A check's settings type: bare ``Check`` (the runner's view, any check) means ``Check[CheckSettings]``; covariant,
# so ``GpuCheck`` (a ``Check[GpuSettings]``) is a ``Check``.
S_co = TypeVar("S_co", bound=CheckSettings, covariant=True, default=CheckSettings)
S = TypeVar("S", bound=CheckSettings)


class Check(Generic[S_co]):
    """A check has a stable snake_case ``name`` and a blocking ``run`` that may raise.

    ``class GpuCheck(Check[GpuSettings])``: the type argument is the check's settings model (``settings_model``,
    its ``[checks.<name>]`` table), and ``self.settings`` is typed as it. Built with ``(settings, env)``: this
    ``__init__`` is the one place a check takes them (a check with state of its own calls it first). Instances
    live as long as the process, so a check may keep history between runs (rates, windows) on ``self``.

    The lifecycle is ``start()``, any number of ``run()``, ``stop()``; ``CheckRunner`` calls start and stop, for
    ``dgxdoctor check`` as for the daemon (where a reload that replaces a check stops the old instance). The
    defaults do nothing; a check that follows an event source or holds a handle (NVML) overrides them.
    """

    name: ClassVar[str]
    settings_model: ClassVar[type[CheckSettings]] = CheckSettings
    # The external probes a run may wait on and report as timed out (``CheckResult.timeouts``): their counters
    # are exported at 0 from the start. ``hang_probe`` is what a whole run that timed out was stuck in.
    probes: ClassVar[tuple[str, ...]] = ()
    hang_probe: ClassVar[str] = "run"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """``settings_model`` from the type argument of ``Check[...]``, so the two can never disagree."""
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):  # its own bases: a subclass of a check keeps its model
            args = get_args(base)
            if get_origin(base) is Check and args and isinstance(args[0], type):
                cls.settings_model = args[0]

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        self.settings: S_co = cast(S_co, own_settings(self.name, settings, self.settings_model))
        self.env = env

    def run(self) -> CheckResult:
        raise NotImplementedError

    def zero_samples(self) -> tuple[Sample, ...]:
        """The check's counters at 0 for every label value they can take that is known before the first run (the
        logs check: one per signature code). The daemon exports them from the check's start, so that Prometheus's
        ``increase()`` sees the first event: a counter born at 1 shows no increase. Counters whose label values
        are found at run time (a GPU, a port) are not listed; the default lists none."""
        return ()

    def start(self) -> None:
        """Before the first run: start following event sources (``env.one_shot`` tells the one-shot run)."""
        return None

    def stop(self) -> None:
        """After the last run: stop followers, release handles. Must be safe to call more than once."""
        return None


def capped(settings: S, limit_s: float) -> S:
    """The settings with ``timeout_s`` no longer than ``limit_s`` (a run under a deadline of its own)."""
    if settings.timeout_s <= limit_s:
        return settings
    return replace(settings, timeout_s=limit_s)


def own_settings(check: str, settings: CheckSettings, model: type[S]) -> S:
    """``settings`` as the check's own model, TypeError otherwise (a table handed to the wrong check)."""
    if not isinstance(settings, model):
        raise TypeError(f"{check} check needs {model.__name__}, got {type(settings).__name__}")
    return settings


class CheckFactory(Protocol):
    """A check class. Read-only properties here: mypy never matches a ClassVar protocol member to a class."""

    @property
    def name(self) -> str: ...

    @property
    def settings_model(self) -> type[CheckSettings]: ...

    def __call__(self, settings: CheckSettings, env: Environment) -> Check: ...


class _Run:
    """One run of one check on a daemon thread of its own (not a pool: a hung call must not eat a shared worker
    forever). ``done`` is set when ``check.run`` returns or raises; ``notify``, when given, is called then too (from
    that thread: the daemon's loop wakes through ``call_soon_threadsafe``)."""

    def __init__(self, check: Check, notify: Callable[[], object] | None = None) -> None:
        self.outcome: CheckResult | None = None
        self.error: BaseException | None = None
        self.finished = 0.0  # time.monotonic() when it returned
        self.done = threading.Event()
        self._check = check
        self._notify = notify
        self.thread = threading.Thread(target=self._work, name=f"check-{check.name}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            self.outcome = self._check.run()
        except BaseException as exc:  # every failure becomes UNKNOWN
            self.error = exc
        self.finished = time.monotonic()
        self.done.set()
        if self._notify is not None:
            # A run that returns after its timeout may find the loop gone (one-shot `check` has exited).
            with contextlib.suppress(RuntimeError):
                self._notify()


class CheckRunner:
    """Runs checks off the caller's thread with a timeout; any exception or timeout becomes UNKNOWN.

    A thread stuck in a hung call (NVML when a GPU fell off the bus) cannot be killed. The runner
    remembers it and does not start a second one; later runs report the hang until it returns.
    The daemon awaits runs on its event loop (``run``, ``run_all``); ``dgxdoctor check`` waits for them on its
    own thread (``run_once_blocking``) and so never loads asyncio.
    """

    def __init__(self, env: Environment) -> None:
        self._env = env
        self._hung: dict[str, threading.Thread] = {}
        self.timeouts_total: dict[str, int] = {}

    def _hung_result(self, check: Check) -> CheckResult | None:
        """The UNKNOWN of a check whose previous run has not returned yet; None when it may run."""
        stuck = self._hung.get(check.name)
        if stuck is not None and stuck.is_alive():
            return CheckResult.unknown(
                check.name, f"previous run has not returned after timing out ({check.name} is hung)"
            )
        self._hung.pop(check.name, None)
        return None

    def _settled(self, check: Check, run: _Run, started_at: float, t0: float) -> CheckResult:
        """The result of a run that returned (``run.done``) or timed out (not done)."""
        name = check.name
        if not run.done.is_set():
            self._hung[name] = run.thread
            self.timeouts_total[name] = self.timeouts_total.get(name, 0) + 1
            probe = getattr(check, "hang_probe", "run")
            timeout = check.settings.timeout_s
            hung = f"{name} did not answer in {timeout:g} s" + ("" if probe == "run" else f" ({probe} hung)")
            result = replace(CheckResult.unknown(name, hung), timeouts=(probe,))
        elif run.error is not None or run.outcome is None:
            exc = run.error if isinstance(run.error, Exception) else RuntimeError(repr(run.error))
            what = own_exhaustion(exc)
            if what is not None and not isinstance(exc, AgentExhausted):
                exc = AgentExhausted(f"dgxdoctor itself is out of {what} ({exc})")
            result = CheckResult.unknown(name, f"{type(exc).__name__}: {exc}")
        else:
            result = run.outcome
        if result.check != name:
            result = replace(result, check=name)
        result = judged_result(result)  # every finding with what follows from it (judge.consequence)
        end = run.finished if run.done.is_set() else time.monotonic()
        return replace(result, started_at=started_at, duration_s=end - t0)

    async def run(self, check: Check) -> CheckResult:
        import asyncio

        from dgxdoctor.compat.aio import wait_for

        started_at, t0 = self._env.clock(), time.monotonic()
        hung = self._hung_result(check)
        if hung is not None:
            return replace(hung, started_at=started_at)
        loop = asyncio.get_running_loop()
        returned = asyncio.Event()
        run = _Run(check, lambda: loop.call_soon_threadsafe(returned.set))
        with contextlib.suppress(TimeoutError):
            await wait_for(returned.wait(), check.settings.timeout_s)
        return self._settled(check, run, started_at, t0)

    async def run_all(self, checks: list[Check]) -> list[CheckResult]:
        import asyncio

        return list(await asyncio.gather(*(self.run(c) for c in checks)))

    async def run_once(self, checks: list[Check]) -> list[CheckResult]:
        """Start every check, run them all in parallel, stop them (the daemon's `POST /check/run`)."""
        for check in checks:
            self.start(check)
        try:
            return await self.run_all(checks)
        finally:
            self.stop_all(checks)

    def run_once_blocking(self, checks: list[Check]) -> list[CheckResult]:
        """``dgxdoctor check``: ``run_once`` on the caller's thread. Every run starts at once; each is waited for
        until its own timeout from that start, as on the loop."""
        for check in checks:
            self.start(check)
        try:
            started_at, t0 = self._env.clock(), time.monotonic()
            runs: list[tuple[Check, _Run | CheckResult]] = []
            for check in checks:
                hung = self._hung_result(check)
                runs.append((check, replace(hung, started_at=started_at) if hung is not None else _Run(check)))
            results = []
            for check, run in runs:
                if isinstance(run, _Run):
                    run.done.wait(max(0.0, t0 + check.settings.timeout_s - time.monotonic()))
                    results.append(self._settled(check, run, started_at, t0))
                else:
                    results.append(run)
            return results
        finally:
            self.stop_all(checks)

    def start(self, check: Check) -> None:
        """The one place a check is started; a broken event source is logged, the check still runs."""
        try:
            check.start()
        except Exception as exc:
            log.error("check_start_failed", check=check.name, error=f"{type(exc).__name__}: {exc}")

    def stop(self, check: Check) -> None:
        """The one place a check is stopped; a check whose run is hung is left alone (stopping could hang too)."""
        stuck = self._hung.get(check.name)
        if stuck is not None and stuck.is_alive():
            log.warning("check_stop_skipped", check=check.name, reason="a run is hung")
            return
        try:
            check.stop()
        except Exception as exc:
            log.error("check_stop_failed", check=check.name, error=f"{type(exc).__name__}: {exc}")

    def stop_all(self, checks: Iterable[Check]) -> None:
        for check in checks:
            self.stop(check)


def probe_labels(check: Check) -> tuple[str, ...]:
    """Every probe label the check can report a timeout for, the whole run's included."""
    hang = getattr(check, "hang_probe", "run")
    probes: tuple[str, ...] = getattr(check, "probes", ())
    return (*probes, *(() if hang in probes else (hang,)))

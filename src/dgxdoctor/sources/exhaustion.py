"""The agent's own descriptor exhaustion, told apart from a failure of the service it calls (no httpx here: the
check runner imports it on every start, benchmarks/startup.py)."""

from __future__ import annotations

import errno

# The agent's own process (or the whole system) is out of descriptors: no socket can be opened to anything. That is
# dgxdoctor's own problem, never a finding about the service it tried to reach.
OWN_EXHAUSTION = {errno.EMFILE: "open files (RLIMIT_NOFILE)", errno.ENFILE: "open files of the whole system"}


class AgentExhausted(Exception):
    """dgxdoctor itself could not open a connection for lack of descriptors (not an ``httpx.HTTPError``: a check
    must not judge the remote service on it; the runner turns it into UNKNOWN with this text)."""


def own_exhaustion(exc: BaseException) -> str | None:
    """What ran out, when ``exc`` (or what caused it) is EMFILE/ENFILE; else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in OWN_EXHAUSTION:
            return OWN_EXHAUSTION[current.errno]
        current = current.__cause__ or current.__context__
    return None

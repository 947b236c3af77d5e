"""What the daemon last heard from each peer: the peer comparison's fetch of every peer's ``/state``, kept.

The status page renders the peers from here, so a page load asks no peer anything: a wedged or trickling peer
costs the page nothing, and a page reloaded in a loop is no stream of requests to every peer. The comparison writes
on its check thread; the page reads on the event loop (a lock between them, as in the result store).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from msgspec import Struct

if TYPE_CHECKING:  # the daemon holds this from its start; httpx and the document models load with the first fetch
    from dgxdoctor.documents import ResultsDocument
    from dgxdoctor.fleet.peers import PeerFetch


class PeerState(Struct, frozen=True):
    """One peer as last fetched: its validated document, or why there is none, and when."""

    url: str
    label: str
    document: ResultsDocument | None
    error: str | None
    fetched_at: float  # wall clock


class PeerStates:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_url: dict[str, PeerState] = {}

    def record(self, fetched: Sequence[PeerFetch]) -> None:
        """One comparison's fetch of every configured peer: replaces what was held (a peer a reload removed
        leaves with it)."""
        states = {f.url: PeerState(f.url, f.label, f.document, f.error, f.fetched_at) for f in fetched}
        with self._lock:
            self._by_url = states

    def get(self, url: str) -> PeerState | None:
        with self._lock:
            return self._by_url.get(url)

    def all(self) -> list[PeerState]:
        """Every peer as last fetched (the fleet breaker's view of the others)."""
        with self._lock:
            return list(self._by_url.values())

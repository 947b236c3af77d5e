"""Prometheus text exposition (what a ``/metrics`` endpoint answers) -> an indexed, queryable snapshot.

The parsing itself is prometheus-client's (``text_string_to_metric_families``), the reference parser of the text
format (https://prometheus.io/docs/instrumenting/exposition_formats/). This module adds what a check needs on top:
values by sample name summed or maxed over label sets, histograms as cumulative buckets, and a lookup that accepts
several names so both generations of an exporter's metric names are read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from msgspec import Struct, field

# A payload larger than this is not a metrics page (vLLM's is ~30 KiB; a DP=8 server a few hundred KiB).
MAX_PROM_TEXT_CHARS = 16 * 1024 * 1024

Labels = Mapping[str, str]


class PromTextError(ValueError):
    """The payload is not Prometheus text exposition; the message says what is wrong and where."""


class PromSample(Struct, frozen=True):
    name: str
    labels: Labels
    value: float


class Histogram(Struct, frozen=True):
    """One histogram, summed over the label sets that matched: cumulative counts by upper bound ``le``.

    ``buckets`` is sorted by bound and ends with ``+Inf`` (whose count is the total number of observations).
    """

    buckets: tuple[tuple[float, float], ...]
    sum: float | None = None

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def as_dict(self) -> dict[float, float]:
        return dict(self.buckets)


def _matches(labels: Labels, match: Labels | None) -> bool:
    return match is None or all(labels.get(k) == v for k, v in match.items())


class PromSnapshot(Struct, frozen=True):
    """Every sample of one scrape, indexed by sample name (``foo_total``, ``foo_bucket``, ``foo``)."""

    samples: Mapping[str, tuple[PromSample, ...]]
    types: Mapping[str, str] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.samples

    def names(self) -> list[str]:
        return sorted(self.samples)

    def get(self, *names: str, match: Labels | None = None) -> tuple[str, tuple[PromSample, ...]] | None:
        """The samples of the first of ``names`` present (newer name first, older after), with that name."""
        for name in names:
            found = tuple(s for s in self.samples.get(name, ()) if _matches(s.labels, match))
            if found:
                return name, found
        return None

    def sum(self, *names: str, match: Labels | None = None) -> float | None:
        """Sum over label sets (e.g. requests waiting across data-parallel engines); None when absent."""
        got = self.get(*names, match=match)
        if got is None:
            return None
        values = [s.value for s in got[1] if not math.isnan(s.value)]
        return math.fsum(values) if values else None

    def max(self, *names: str, match: Labels | None = None) -> float | None:
        """Largest value over label sets (e.g. the fullest engine's KV cache); None when absent."""
        got = self.get(*names, match=match)
        if got is None:
            return None
        values = [s.value for s in got[1] if not math.isnan(s.value)]
        return max(values) if values else None

    def label_values(self, label: str, *names: str) -> list[str]:
        got = self.get(*names)
        if got is None:
            return []
        return sorted({s.labels[label] for s in got[1] if label in s.labels})

    def histogram(self, *bases: str, match: Labels | None = None) -> Histogram | None:
        """The first of ``bases`` (histogram names without ``_bucket``) present, summed over label sets.

        Buckets with the same bound from several label sets (engines) add up, as ``sum by (le)`` does.
        """
        for base in bases:
            buckets = [s for s in self.samples.get(f"{base}_bucket", ()) if _matches(s.labels, match)]
            if not buckets:
                continue
            by_le: dict[float, float] = {}
            for s in buckets:
                raw = s.labels.get("le")
                if raw is None:
                    raise PromTextError(f"{base}_bucket sample without an 'le' label: {dict(s.labels)}")
                try:
                    bound = float(raw)
                except ValueError:
                    raise PromTextError(f"{base}_bucket has a bad 'le' label {raw!r}") from None
                by_le[bound] = by_le.get(bound, 0.0) + s.value
            if math.inf not in by_le:
                raise PromTextError(f'{base} histogram has no le="+Inf" bucket')
            return Histogram(tuple(sorted(by_le.items())), self.sum(f"{base}_sum", match=match))
        return None


def parse_prom_text(text: str) -> PromSnapshot:
    """Parse a ``/metrics`` payload. Raises PromTextError naming the problem (HTML page, garbage, empty)."""
    if len(text) > MAX_PROM_TEXT_CHARS:
        raise PromTextError(f"metrics payload is {len(text)} characters, more than {MAX_PROM_TEXT_CHARS}")
    stripped = text.lstrip()
    if not stripped:
        raise PromTextError("metrics payload is empty")
    if stripped.startswith(("<", "{", "[")):
        raise PromTextError(f"metrics payload is not Prometheus text (starts with {stripped[:40]!r})")
    # Imported here: a `dgxdoctor check` on a node where no vLLM answers never loads prometheus-client.
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[PromSample]] = {}
    types: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for s in family.samples:
                samples.setdefault(s.name, []).append(PromSample(s.name, dict(s.labels), float(s.value)))
    except (ValueError, OverflowError) as exc:  # OverflowError: an integer sample value too large for a float
        raise PromTextError(f"metrics payload is not valid Prometheus text: {exc}") from None
    if not samples:
        raise PromTextError("metrics payload has no samples")
    return PromSnapshot({k: tuple(v) for k, v in samples.items()}, types)


def histogram_delta(newer: Histogram, older: Histogram | None) -> Histogram:
    """Observations made between two scrapes of the same histogram (what ``increase()`` gives per bucket).

    A counter reset (the server restarted: any bucket went down) or changed bucket bounds make the older scrape
    useless; the newer one is then taken whole, as Prometheus does for a reset.
    """
    if older is None:
        return newer
    old = older.as_dict()
    if set(old) != {le for le, _ in newer.buckets} or any(c < old[le] for le, c in newer.buckets):
        return newer
    total = None if newer.sum is None or older.sum is None else newer.sum - older.sum
    return Histogram(tuple((le, c - old[le]) for le, c in newer.buckets), total)


def histogram_quantile(q: float, hist: Histogram) -> float | None:
    """The ``q`` quantile of a cumulative histogram, computed as PromQL's ``histogram_quantile`` does.

    Linear interpolation inside the bucket that holds rank ``q * count``; the first bucket's lower bound is 0 (when
    its upper bound is positive); a rank in the ``+Inf`` bucket gives the largest finite bound. None when the
    histogram has no observations (PromQL's NaN). See prometheus/promql/quantile.go ``bucketQuantile``.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    buckets = list(hist.buckets)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return None
    # Cumulative counts must not decrease; scrapes taken mid-update can break that, PromQL evens it out.
    fixed: list[tuple[float, float]] = []
    running = 0.0
    for le, c in buckets:
        running = max(running, c)
        fixed.append((le, running))
    total = fixed[-1][1]
    if total <= 0:
        return None
    rank = q * total
    idx = next(i for i, (_, c) in enumerate(fixed) if c >= rank)
    if idx == len(fixed) - 1:
        return fixed[-2][0]
    if idx == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start = 0.0 if idx == 0 else fixed[idx - 1][0]
    end = fixed[idx][0]
    below = 0.0 if idx == 0 else fixed[idx - 1][1]
    in_bucket = fixed[idx][1] - below
    if in_bucket <= 0:
        return end
    return start + (end - start) * (rank - below) / in_bucket


def first_present(snapshot: PromSnapshot, names: Iterable[str]) -> str | None:
    """Which of ``names`` this scrape has (tells which generation of metric names an exporter speaks)."""
    return next((n for n in names if n in snapshot), None)

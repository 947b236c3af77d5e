"""The Prometheus collector over the result store, on a private registry. A scrape never runs a check.

Every family gets a ``node`` label (checks never set it). Samples of the same family from different checks
are merged into one family; a family whose type or labels disagree between checks keeps the first check's
definition and drops the rest (logged once), so a scrape never fails over it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dgxdoctor import __version__, eventlog
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, MetricSpec, Sample, Status

log = eventlog.get_logger(__name__)

NODE_LABEL = "node"

CHECK_STATUS = MetricSpec(
    "dgxdoctor_check_status",
    "latest status of the check: 0 ok, 1 warning, 2 critical, 3 unknown, -1 skipped (not applicable here)",
    labels=("check",),
)
CHECK_SUCCESS = MetricSpec(
    "dgxdoctor_check_success",
    "1 if the check's latest run completed and reached a verdict, 0 if it failed, timed out or was unknown",
    labels=("check",),
)
CHECK_DURATION = MetricSpec(
    "dgxdoctor_check_duration_seconds", "how long the check's latest run took", labels=("check",)
)
CHECK_LAST_RUN = MetricSpec(
    "dgxdoctor_check_last_run_timestamp_seconds",
    "Unix time the check's latest run started",
    labels=("check",),
)
CHECK_RUNS = MetricSpec(
    "dgxdoctor_check_runs_total", "runs of the check since dgxdoctor started", "counter", ("check",)
)
CHECK_TIMEOUTS = MetricSpec(
    "dgxdoctor_check_timeouts_total",
    "runs of the check that did not answer within its timeout_s since dgxdoctor started",
    "counter",
    ("check",),
)
PROBE_TIMEOUTS = MetricSpec(
    "dgxdoctor_probe_timeouts_total",
    "external probes that timed out, by check and probe (nvml, nvidia-smi, ibstat, ray status, the dashboard, vLLM's "
    "/health, the NCCL probe, the version probe, peer fetches; 'run': the check's whole run); 0 from the start",
    "counter",
    ("check", "probe"),
)
CHECK_FINDINGS = MetricSpec(
    "dgxdoctor_check_findings",
    "findings in the check's latest result, by status",
    labels=("check", "status"),
)
CHECK_FINDINGS_BY_CODE = MetricSpec(
    "dgxdoctor_check_findings_by_code",
    "findings in the check's latest result, by finding code and status (warning, critical, unknown); what alert "
    "rules and remediation key on",
    labels=("check", "code", "status"),
)
NODE_FACT = MetricSpec(
    "dgxdoctor_node_fact_info",
    "a node fact compared between nodes for drift (driver, CUDA, kernel, vLLM, Ray, NCCL versions, NCCL "
    "environment, model fingerprint); value always 1",
    "info",
    ("key", "value"),
)
NODE_INFO = MetricSpec(
    "dgxdoctor_node_info",
    'this node\'s serving group ([node] group; "default" when unset); value always 1. The one series that carries '
    "the group: the shipped rules join it on node (docs/fleet.md)",
    "info",
    ("group",),
)
FINDING_INFO = MetricSpec(
    "dgxdoctor_finding_info",
    "a warning, critical or unknown finding of the check's latest result, by code and subject (what it is about: a "
    "GPU, a port, a node; empty when none), value always 1: Prometheus as the cluster view reads these (the message "
    "is never a label: it is read from the node's /state). At most 64 series per node, the worst first",
    "info",
    ("check", "code", "subject", "status"),
)
# The finding series are bounded: a node with many findings (a flood of XIDs on 8 GPUs) exports its worst 64, and a
# subject is cut to a label's worth; the rest is in /state.
MAX_FINDING_SERIES = 64
MAX_SUBJECT_CHARS = 128
BUILD_INFO = MetricSpec("dgxdoctor_build_info", "the running dgxdoctor version; value always 1", "info", ("version",))

# The daemon's own health: its HTTP port, the files it writes.
HTTP_CONNECTIONS = MetricSpec("dgxdoctor_http_connections", "client connections open to dgxdoctor's HTTP port")
HTTP_MAX_CONNECTIONS = MetricSpec(
    "dgxdoctor_http_max_connections",
    "the cap on client connections in force: [daemon] max_connections, bounded by the open-file limit",
)
HTTP_CLOSED = MetricSpec(
    "dgxdoctor_http_connections_closed_total",
    "client connections dgxdoctor closed, by reason: header_timeout (no complete request head in time), "
    "idle_timeout, request_timeout, evicted (the longest-idle one, to admit a new one over the cap), "
    "over_capacity (refused: every connection mid-request), shutdown",
    "counter",
    ("reason",),
)
HTTP_BAD_REQUESTS = MetricSpec(
    "dgxdoctor_http_bad_requests_total",
    "malformed HTTP requests answered 400 (logged as one line each at a bounded rate)",
    "counter",
)
EVENT_LOOP_ERRORS = MetricSpec(
    "dgxdoctor_event_loop_errors_total",
    "errors the event loop reported (e.g. accept() out of descriptors), by exception type",
    "counter",
    ("error",),
)
WRITE_ERRORS = MetricSpec(
    "dgxdoctor_write_errors_total",
    "failed writes of a file dgxdoctor keeps (state files in state_dir, the node_exporter textfile): disk full, "
    "read-only, permissions",
    "counter",
    ("file",),
)
TEXTFILE_WRITTEN = MetricSpec(
    "dgxdoctor_textfile_write_timestamp_seconds",
    "Unix time the node_exporter textfile was last written successfully (in the textfile: when it was written; "
    "time() minus this is its age)",
)
# As Prometheus and Alertmanager export theirs: a rejected reload keeps the old config and is otherwise invisible.
CONFIG_RELOAD_OK = MetricSpec(
    "dgxdoctor_config_last_reload_successful",
    "1 when the last configuration reload (SIGHUP, POST /reload) was accepted or none was asked, 0 when it was "
    "rejected and the previous configuration is still in force",
)
CONFIG_RELOAD_TIME = MetricSpec(
    "dgxdoctor_config_last_reload_success_timestamp_seconds",
    "Unix time the configuration in force was loaded (start or the last accepted reload)",
)
DAEMON_METRICS: tuple[MetricSpec, ...] = (
    CONFIG_RELOAD_OK,
    CONFIG_RELOAD_TIME,
    HTTP_CONNECTIONS,
    HTTP_MAX_CONNECTIONS,
    HTTP_CLOSED,
    HTTP_BAD_REQUESTS,
    EVENT_LOOP_ERRORS,
    WRITE_ERRORS,
    TEXTFILE_WRITTEN,
)

OWN_METRICS: tuple[MetricSpec, ...] = (
    BUILD_INFO,
    NODE_INFO,
    FINDING_INFO,
    CHECK_STATUS,
    CHECK_SUCCESS,
    CHECK_DURATION,
    CHECK_LAST_RUN,
    CHECK_RUNS,
    CHECK_TIMEOUTS,
    PROBE_TIMEOUTS,
    CHECK_FINDINGS,
    CHECK_FINDINGS_BY_CODE,
    NODE_FACT,
    *DAEMON_METRICS,
)


_FINDING_LEVELS = (Status.WARNING, Status.CRITICAL, Status.UNKNOWN)

_Family = GaugeMetricFamily | CounterMetricFamily


def _family(spec: MetricSpec, extra_labels: tuple[str, ...] = ()) -> _Family:
    labels = [NODE_LABEL, *spec.labels, *extra_labels]
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


class StoreCollector(Collector):
    """Builds fresh families from the store at every scrape."""

    def __init__(
        self,
        store: ResultStore,
        timeouts: Callable[[], Mapping[str, int]] | None = None,
        own: Callable[[], Iterable[Sample]] | None = None,
    ) -> None:
        self.store = store
        self.timeouts = timeouts or dict
        self.own = own
        self._warned: set[tuple[str, str]] = set()

    def describe(self) -> list[Metric]:
        # Unchecked registry: the families depend on which checks ran.
        return []

    def collect(self) -> Iterator[Metric]:
        node = self.store.node
        latest = self.store.latest()
        names = sorted(latest)
        build = _family(BUILD_INFO)
        build.add_metric([node, __version__], 1.0)
        yield build
        info = _family(NODE_INFO)
        info.add_metric([node, self.store.group], 1.0)
        yield info
        yield _finding_family(node, latest)
        status = _family(CHECK_STATUS)
        success = _family(CHECK_SUCCESS)
        duration = _family(CHECK_DURATION)
        last_run = _family(CHECK_LAST_RUN)
        findings = _family(CHECK_FINDINGS)
        by_code = _family(CHECK_FINDINGS_BY_CODE)
        for name in names:
            r = latest[name]
            status.add_metric([node, name], float(r.status.code))
            success.add_metric([node, name], 0.0 if r.status is Status.UNKNOWN or r.error else 1.0)
            duration.add_metric([node, name], r.duration_s)
            last_run.add_metric([node, name], r.started_at)
            for level in (Status.WARNING, Status.CRITICAL, Status.UNKNOWN):
                findings.add_metric([node, name, level.value], float(sum(f.status is level for f in r.findings)))
            codes = Counter((f.code, f.status.value) for f in r.findings if f.status in _FINDING_LEVELS)
            for (code, level_name), count in sorted(codes.items()):
                by_code.add_metric([node, name, code, level_name], float(count))
        yield from (status, success, duration, last_run, findings, by_code)
        runs = _family(CHECK_RUNS)
        for name, count in sorted(self.store.runs_total().items()):
            runs.add_metric([node, name], float(count))
        yield runs
        timeouts = _family(CHECK_TIMEOUTS)
        # Every check that ran has a timeout count, 0 until one times out: rate() and increase() need the zero.
        counts = dict.fromkeys(self.store.runs_total(), 0) | dict(self.timeouts())
        for name, count in sorted(counts.items()):
            timeouts.add_metric([node, name], float(count))
        yield timeouts
        probes = _family(PROBE_TIMEOUTS)
        for (check, probe), count in sorted(self.store.probe_timeouts().items()):
            probes.add_metric([node, check, probe], float(count))
        yield probes
        facts = _family(NODE_FACT)
        for key, value in sorted(self.store.facts().items()):
            facts.add_metric([node, key, value], 1.0)
        yield facts
        if self.own is not None:
            yield from _own_families(node, self.own())
        # Each check's samples, then its declared counters (``Check.zero_samples``) that its result lacks: at 0
        # before the first count, at their last value after a run that exported none.
        held = self.store.held_samples()
        sources = [(n, latest[n].samples) for n in names] + [(n, held[n]) for n in sorted(held)]
        yield from self._check_samples(node, sources)

    def _check_samples(self, node: str, sources: list[tuple[str, tuple[Sample, ...]]]) -> Iterator[Metric]:
        specs: dict[str, MetricSpec] = {}
        families: dict[str, _Family] = {}
        seen: dict[str, set[tuple[str, ...]]] = {}
        for check, samples in sources:
            for sample in samples:
                spec = sample.metric
                first = specs.setdefault(spec.name, spec)
                if first != spec or NODE_LABEL in spec.labels or spec.name in _OWN_NAMES:
                    self._warn_once(check, spec.name)
                    continue
                family = families.get(spec.name)
                if family is None:
                    family = families[spec.name] = _family(spec)
                    seen[spec.name] = set()
                values = tuple(sample.labels[label] for label in spec.labels)
                if values in seen[spec.name]:
                    continue  # the same series from two checks, or held and in the result: the first one wins
                seen[spec.name].add(values)
                family.add_metric([node, *values], sample.value)
        for name in sorted(families):
            yield families[name]

    def _warn_once(self, check: str, metric: str) -> None:
        if (check, metric) not in self._warned:
            self._warned.add((check, metric))
            log.warning("metric_conflict", check=check, metric=metric, detail="type/labels differ or reserved")


_OWN_NAMES = frozenset(spec.name for spec in OWN_METRICS)


def _finding_family(node: str, latest: Mapping[str, CheckResult]) -> Metric:
    """``dgxdoctor_finding_info``: one series per (check, code, subject, status) of the latest results' findings
    that are not ok, the worst ``MAX_FINDING_SERIES`` of them."""
    family = _family(FINDING_INFO)
    rows = {
        (name, f.code, (f.subject or "")[:MAX_SUBJECT_CHARS], f.status)
        for name, r in latest.items()
        for f in r.findings
        if f.status in _FINDING_LEVELS
    }
    worst = sorted(rows, key=lambda row: (-row[3].rank, row[0], row[1], row[2]))[:MAX_FINDING_SERIES]
    for check, code, subject, status in sorted(worst, key=lambda row: row[:3]):
        family.add_metric([node, check, code, subject, status.value], 1.0)
    return family


def _own_families(node: str, samples: Iterable[Sample]) -> Iterator[Metric]:
    """The daemon's own samples (one of ``DAEMON_METRICS`` each), grouped into families."""
    families: dict[str, _Family] = {}
    for sample in samples:
        spec = sample.metric
        family = families.get(spec.name)
        if family is None:
            family = families[spec.name] = _family(spec)
        family.add_metric([node, *(sample.labels[label] for label in spec.labels)], sample.value)
    for name in sorted(families):
        yield families[name]


def make_registry(
    store: ResultStore,
    timeouts: Callable[[], Mapping[str, int]] | None = None,
    own: Callable[[], Iterable[Sample]] | None = None,
) -> CollectorRegistry:
    """A private registry holding only our collector (no process/platform collectors of the default one).

    ``own`` gives the daemon's own samples (``DAEMON_METRICS``: its HTTP port, its file writes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, timeouts, own))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)

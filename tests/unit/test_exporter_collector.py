"""The exposition: names, the node label, merged families, and a golden file guarding all of it.

The golden file is what the real checks export over the fixture trees (the recorded H200 NVML capture, a DGX
InfiniBand sysfs tree with a degraded port, a kernel log with XID 79 and 154), as node_exporter's
``collector/fixtures/e2e-output.txt`` is: a renamed metric, label or finding code is a golden diff. Only the
times are pinned. Rewrite it after an intended change:
``DGXDOCTOR_REWRITE_GOLDEN=1 pytest tests/unit/test_exporter_collector.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

from msgspec.structs import replace
from prometheus_client.parser import text_string_to_metric_families

from conftest import FIXTURES
from dgxdoctor.checks.gpu import GpuCheck, GpuSettings
from dgxdoctor.checks.infiniband import InfinibandCheck, InfinibandSettings
from dgxdoctor.checks.xid import XidCheck, XidSettings
from dgxdoctor.environment import Environment
from dgxdoctor.exporters.collector import exposition, make_registry
from dgxdoctor.exporters.textfile import write_textfile
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Sample, Status
from fake_nvml import FakeNvml, load_capture
from fakechecks import FAKE_INFO, GPU_UTIL, IB_ERRORS, XID_TOTAL, gpu_result
from sysfstree import build_sysfs_tree

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "daemon_metrics.prom"


def populated_store() -> ResultStore:
    """A fixed set of results covering every kind of family the collector emits."""
    store = ResultStore("dgx-a")
    gpu = gpu_result(util=0.75)
    store.put(replace(gpu, started_at=1_700_000_000.0, duration_s=0.012))
    ib = ResultBuilder("infiniband")
    ib.sample(IB_ERRORS, 0.5, device="mlx5_0", port="1", counter="symbol_error")
    ib.add(Finding("IB_SYMBOL_ERROR", Status.WARNING, "0.5/s symbol errors", "mlx5_0/1"))
    ib_result = ib.build("1 port degraded")
    store.put(replace(ib_result, started_at=1_700_000_001.0, duration_s=0.003))
    xid = CheckResult(
        "xid",
        Status.CRITICAL,
        "XID 79",
        findings=(Finding("XID_79", Status.CRITICAL, "fell off the bus", "00000000:18:00.0"),),
        samples=(
            Sample(XID_TOTAL, 2, {"pci_bus_id": "00000000:18:00.0", "xid": "79"}),
            Sample(FAKE_INFO, 1, {"model": 'quote " and \\ backslash'}),
        ),
        started_at=1_700_000_002.0,
        duration_s=0.001,
    )
    store.put(xid)
    # A second check exporting the same family: merged into one family, duplicate series dropped.
    store.put(
        CheckResult(
            "zz_second",
            Status.SKIPPED,
            "no device",
            samples=(
                Sample(GPU_UTIL, 0.5, {"gpu": "7", "pci_bus_id": "00000000:DF:00.0"}),
                Sample(GPU_UTIL, 0.1, {"gpu": "0", "pci_bus_id": "00000000:18:00.0"}),
            ),
            started_at=1_700_000_003.0,
        )
    )
    # Counters exist at 0 for every declared check and probe; a timed-out run counts its probe.
    store.declare("infiniband", ("ibstat",))
    store.declare("zz_never_ran", ("nvidia-smi", "run"))
    hung = CheckResult.unknown("zz_timeout", "zz_timeout did not answer in 20 s (nvml hung)")
    store.put(replace(hung, timeouts=("nvml",)))
    return store


def real_store(tmp_path: Path) -> ResultStore:
    """The gpu, infiniband and xid checks, run once over the fixture trees; their times pinned."""
    now = 1_700_000_000.0
    sysfs = build_sysfs_tree(tmp_path / "sys", "dgx_ndr_degraded.txt")
    kmsg = tmp_path / "kern.log"
    kmsg.write_text((FIXTURES / "kernel_log" / "dmesg_ctime_xid79_xid154_node_reboot.txt").read_text())
    boot = tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("6c0a3b1e-0000-4000-8000-000000000001\n")
    env = Environment(
        node="dgx-a", sysfs_root=sysfs, proc_root=tmp_path / "proc", kmsg_path=kmsg, state_dir=tmp_path / "state",
        nvml_factory=lambda: FakeNvml(load_capture("h200-2gpu-580.159.04.json")),
        clock=lambda: now, monotonic=lambda: 10_000.0,
    )  # fmt: skip
    checks = [
        GpuCheck(GpuSettings(expected_count=2, expected_model="H200", expected_nvlinks=18), env),
        InfinibandCheck(InfinibandSettings(), env),
        XidCheck(XidSettings(), env),
    ]
    store = ResultStore("dgx-a")
    for i, check in enumerate(checks):
        result = check.run()
        store.put(replace(result, started_at=now + i, duration_s=0.001 * (i + 1)))
    return store


def test_the_golden_comes_from_real_checks_and_their_codes(tmp_path: Path) -> None:
    store = real_store(tmp_path)
    codes = {f.code for r in store.latest().values() for f in r.findings}
    assert "IB_SYMBOL_ERRORS" not in codes  # the old hand-made store's code, which no check emits
    assert {"XID_79"} <= codes and store.latest()["infiniband"].status is not Status.OK


def scrape(store: ResultStore, timeouts: dict[str, int] | None = None) -> str:
    return exposition(make_registry(store, lambda: timeouts or {"zz_timeout": 1})).decode()


def test_probe_timeouts_start_at_zero_and_count() -> None:
    text = scrape(populated_store())
    assert 'dgxdoctor_probe_timeouts_total{check="infiniband",node="dgx-a",probe="ibstat"} 0.0' in text
    assert 'dgxdoctor_probe_timeouts_total{check="zz_never_ran",node="dgx-a",probe="nvidia-smi"} 0.0' in text
    assert 'dgxdoctor_probe_timeouts_total{check="zz_timeout",node="dgx-a",probe="nvml"} 1.0' in text
    assert 'dgxdoctor_check_timeouts_total{check="zz_never_ran",node="dgx-a"} 0.0' in text
    assert 'dgxdoctor_check_runs_total{check="zz_never_ran",node="dgx-a"} 0.0' in text


def test_golden_exposition(tmp_path: Path) -> None:
    text = scrape(real_store(tmp_path), {})
    if os.environ.get("DGXDOCTOR_REWRITE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; rewrite with DGXDOCTOR_REWRITE_GOLDEN=1 if intended"


def test_every_series_has_the_node_label_and_status_codes() -> None:
    families = {f.name: f for f in text_string_to_metric_families(scrape(populated_store()))}
    for family in families.values():
        for sample in family.samples:
            assert sample.labels.get("node") == "dgx-a", sample
    status = {s.labels["check"]: s.value for s in families["dgxdoctor_check_status"].samples}
    assert status == {"gpu": 0, "infiniband": 1, "xid": 2, "zz_second": -1, "zz_timeout": 3}
    success = {s.labels["check"]: s.value for s in families["dgxdoctor_check_success"].samples}
    assert success["zz_timeout"] == 0 and success["xid"] == 1
    timeouts = {s.labels["check"]: s.value for s in families["dgxdoctor_check_timeouts"].samples}
    # every check the store knows has the counter, at 0 until its first timeout
    assert timeouts == {"gpu": 0, "infiniband": 0, "xid": 0, "zz_second": 0, "zz_timeout": 1, "zz_never_ran": 0}
    facts = {s.labels["key"]: s.labels["value"] for s in families["dgxdoctor_node_fact_info"].samples}
    assert facts["driver_version"] == "580.159.04"


def test_same_family_from_two_checks_is_merged() -> None:
    families = {f.name: f for f in text_string_to_metric_families(scrape(populated_store()))}
    util = {(s.labels["gpu"], s.value) for s in families["dgxdoctor_gpu_utilization_ratio"].samples}
    assert util == {("0", 0.75), ("1", 0.75), ("7", 0.5)}  # gpu 0 from zz_second dropped: first check wins


def test_conflicting_definition_is_dropped_not_fatal() -> None:
    store = ResultStore("n")
    store.put(gpu_result())
    clash = MetricSpec("dgxdoctor_gpu_utilization_ratio", "other help", "counter", ("gpu", "pci_bus_id"))
    own = MetricSpec("dgxdoctor_check_status", "hijack", labels=())
    noded = MetricSpec("dgxdoctor_bad_nodes", "sets node itself", labels=("node",))
    store.put(
        CheckResult(
            "zz_bad",  # after "gpu": the first check in name order defines a family
            Status.OK,
            "x",
            samples=(
                Sample(clash, 1, {"gpu": "9", "pci_bus_id": "p"}),
                Sample(own, 5, {}),
                Sample(noded, 1, {"node": "elsewhere"}),
            ),
        )
    )
    text = scrape(store)
    assert 'gpu="9"' not in text and "hijack" not in text and "dgxdoctor_bad_nodes" not in text
    assert list(text_string_to_metric_families(text))


def test_textfile_is_written_atomically(tmp_path: Path) -> None:
    target = tmp_path / "dgxdoctor.prom"
    target.write_text("old\n")
    write_textfile(target, make_registry(populated_store()))
    assert target.read_text().startswith("# HELP dgxdoctor_build_info")
    assert [p.name for p in tmp_path.iterdir()] == ["dgxdoctor.prom"]  # no temporary left behind
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def _matches(store: ResultStore) -> dict[str, float]:
    text = exposition(make_registry(store)).decode()
    return {
        s.labels["code"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "dgxdoctor_logs_signature_matches_total"
    }


def test_declared_counters_exist_at_zero_and_keep_their_value(tmp_path: Path) -> None:
    """The logs check's counter exists at 0 for every catalog code before its first run (``increase()`` then sees
    the first NCCL timeout); after a run that exported nothing (timed out, failed) each keeps its last value, as a
    drop to 0 would read as a counter reset and its return as a new increase; a check removed on reload leaves."""
    from dgxdoctor.checks.logs import MATCHES_TOTAL, LogsCheck, LogsSettings
    from dgxdoctor.judge.signatures import signature_codes

    store = ResultStore("dgx-a")
    check = LogsCheck(LogsSettings(), Environment(state_dir=tmp_path))
    store.declare("logs", (), check.zero_samples())
    assert _matches(store) == dict.fromkeys(signature_codes(), 0.0) and len(signature_codes()) == 33
    b = ResultBuilder("logs")
    b.sample(MATCHES_TOTAL, 2, code="NCCL_TIMEOUT")
    store.put(b.build("one signature"))
    assert _matches(store)["NCCL_TIMEOUT"] == 2.0 and _matches(store)["GLOO_SOCKET"] == 0.0
    store.put(CheckResult.unknown("logs", "timed out"))
    assert _matches(store)["NCCL_TIMEOUT"] == 2.0
    # A reload replaced the check (the daemon keeps its last result; the new instance counts from 0): its first
    # two lines must read as an increase, so the held series starts over (a drop to 0 is a reset, never an increase).
    store.declare("logs", (), LogsCheck(LogsSettings(), Environment(state_dir=tmp_path)).zero_samples())
    store.put(ResultBuilder("logs").build("no signature"))
    assert _matches(store)["NCCL_TIMEOUT"] == 0.0
    store.forget("logs")
    assert _matches(store) == {}

"""Property tests: every pure parser in dgxdoctor.sources and every diagnose analyzer, fed damaged real output
and garbage, returns a value or raises its documented ValueError subclass with a message — nothing else."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.diagnose.base import diagnose_text
from dgxdoctor.diagnose.registry import ANALYZERS
from dgxdoctor.fleet import compare as compare_mod
from dgxdoctor.fleet.peers import BadAnswer, response_json, validate_state
from dgxdoctor.judge import signatures
from dgxdoctor.judge.scan import scan_text
from dgxdoctor.judge.topology import evaluate_topology
from dgxdoctor.sources import (
    fingerprint,
    ibstat,
    kmsg,
    nccl_env,
    nccl_tests,
    perfquery,
    prom_text,
    ray_api,
    ray_status,
    sysfs_ib,
    topo,
    vllm_metrics,
    xid,
)
from dgxdoctor.sources.logtail import LogFollower, Position
from dgxdoctor.sources.statefile import StateFile
from fuzzing import FIXTURES, FUZZ, clean, corpus, deep_json, garbage, json_mutants, json_values, mutated, texts_for

KERNEL = texts_for("kernel_log/*.txt")


# --- kernel log: /dev/kmsg records, XID/SXID/fallen-off lines -------------------------------------------------


@FUZZ
@given(KERNEL)
def test_kmsg_records(text: str) -> None:
    for line in text.splitlines() or [text]:
        record = clean(kmsg.parse_kmsg_record, line, allowed=(kmsg.KmsgFormatError,))
        if record is not None:
            assert isinstance(record.lines, list)
    clean(lambda t: list(kmsg.text_records(t)), text, allowed=(kmsg.KmsgFormatError,))


@FUZZ
@given(KERNEL)
def test_xid_lines(text: str) -> None:
    for line in text.splitlines():
        event = xid.parse_xid_line(line)
        if event is not None:
            assert event.xid >= 0
        xid.parse_sxid_line(line)
        xid.parse_fallen_off_line(line)
    xid.scan_text(text)


def test_xid_catalog_lookups_never_fail() -> None:
    """A code the catalog does not know (a new driver's, a nonsense one) is an UNKNOWN entry asking for support; no
    SXID answers for one."""
    catalog = xid.load_catalog()
    for code in (-1, 0, 10**30):
        entry = catalog.xid(code)
        assert (entry.code, entry.mnemonic, entry.resolution) == (code, "UNKNOWN", xid.UNKNOWN_XID_RESOLUTION)
        assert f"XID {code}" in entry.name
        assert catalog.sxid(code) is None
    assert catalog.xid(79).mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert catalog.xid(1).mnemonic != "UNKNOWN"


# --- topology, ibstat, perfquery, sysfs IB values ------------------------------------------------------------


@FUZZ
@given(texts_for("topo/*"))
def test_topo_matrix(text: str) -> None:
    matrix = clean(topo.parse_topo_matrix, text, allowed=(topo.TopoParseError,))
    if matrix is not None:
        evaluate_topology(matrix, expected_gpus=8)
        topo.gpu_link_summary(matrix)
        json.dumps(matrix.to_data())


@FUZZ
@given(texts_for("ib/ibstat*"))
def test_ibstat(text: str) -> None:
    ibstat.looks_like_ibstat(text)
    ports = clean(ibstat.parse_ibstat, text, allowed=(ibstat.IbstatFormatError,))
    for port in ports or []:
        port.to_dict()
        port.to_ib_port()


@FUZZ
@given(texts_for("ib/perfquery*"))
def test_perfquery(text: str) -> None:
    perfquery.looks_like_perfquery(text)
    clean(perfquery.parse_perfquery, text, allowed=(perfquery.PerfqueryFormatError,))


SYSFS_VALUES = st.one_of(
    garbage(),
    st.sampled_from(["4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "25 Gb/sec (1X EDR)", "123456789", "0"]),
    mutated(["4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "18446744073709551615\n", "-1\n"]),
)


@FUZZ
@given(SYSFS_VALUES)
def test_sysfs_ib_values(text: str) -> None:
    for parse in (sysfs_ib.parse_state, sysfs_ib.parse_phys_state, sysfs_ib.parse_rate, sysfs_ib.parse_counter):
        clean(parse, text, allowed=(sysfs_ib.SysfsFormatError,))
    sysfs_ib.normalize_state(text)
    sysfs_ib.normalize_phys_state(text)


# --- nccl-tests, Prometheus text / vLLM metrics ----------------------------------------------------------------


@FUZZ
@given(texts_for("nccl_tests/*.txt"))
def test_nccl_tests(text: str) -> None:
    nccl_tests.looks_like_nccl_tests(text)
    report = clean(nccl_tests.parse_nccl_tests, text)
    if report is not None:
        report.peak_busbw_gbps  # noqa: B018 - the property must not fail either
        json.dumps(report.to_data(), allow_nan=True)


PROM = texts_for("vllm/*.txt", "golden/*.prom")


@FUZZ
@given(PROM)
def test_prom_text_and_vllm_metrics(text: str) -> None:
    snap = clean(prom_text.parse_prom_text, text, allowed=(prom_text.PromTextError,))
    if snap is not None:
        for name in snap.names()[:20]:
            clean(snap.histogram, name.removesuffix("_bucket"), allowed=(prom_text.PromTextError,))
            snap.sum(name)
    metrics = clean(
        vllm_metrics.parse_vllm_metrics, text, allowed=(prom_text.PromTextError, vllm_metrics.NotVllmMetrics)
    )
    if metrics is not None:
        metrics.tokens_total  # noqa: B018
        metrics.has_load  # noqa: B018
        clean(vllm_metrics.window_stats, metrics, metrics, 10.0, allowed=(prom_text.PromTextError,))
        clean(vllm_metrics.window_stats, metrics, None, 0.0, allowed=(prom_text.PromTextError,))


@FUZZ
@given(st.floats(allow_nan=True), st.lists(st.tuples(st.floats(allow_nan=True), st.floats(allow_nan=True)), max_size=6))
def test_histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> None:
    hist = prom_text.Histogram(tuple(sorted(buckets, key=lambda b: (math.isnan(b[0]), b[0]))), None)
    clean(prom_text.histogram_quantile, q, hist)
    clean(prom_text.histogram_delta, hist, hist)


# --- Ray: dashboard JSON payloads and `ray status` -------------------------------------------------------------

RAY_DOCS = {
    name: [json.loads(p.read_text()) for p in sorted((FIXTURES / "ray").glob(pattern))]
    for name, pattern in (
        ("detail", "*nodes-detail.json"),
        ("summary", "*nodes-summary.json"),
        ("status", "*cluster-status*.json"),
    )
}
RAY_PARSERS = {
    "detail": ray_api.parse_nodes_detail,
    "summary": ray_api.parse_nodes_summary,
    "status": ray_api.parse_cluster_status,
}


@pytest.mark.parametrize("which", sorted(RAY_PARSERS))
@FUZZ
@given(data=st.data())
def test_ray_api_payloads(which: str, data: st.DataObject) -> None:
    parse = RAY_PARSERS[which]
    doc = data.draw(st.one_of(json_mutants(RAY_DOCS[which]), json_values))
    payload = json.dumps(doc)
    clean(parse, payload, allowed=(ray_api.RayApiError,))
    clean(parse, payload.encode()[: data.draw(st.integers(0, len(payload)))], allowed=(ray_api.RayApiError,))
    clean(parse, data.draw(garbage()), allowed=(ray_api.RayApiError,))
    clean(ray_api.parse_version, payload, allowed=(ray_api.RayApiError,))


@pytest.mark.parametrize(
    "parse",
    [
        ray_api.parse_nodes_detail,
        ray_api.parse_nodes_summary,
        ray_api.parse_cluster_status,
        ray_api.parse_version,
    ],
)
def test_ray_api_deeply_nested_json_is_a_clean_error(parse: Any) -> None:
    # Found by the property test: json.loads raises RecursionError (not ValueError) on deep nesting.
    with pytest.raises(ray_api.RayApiError, match="not JSON"):
        parse(deep_json())


@FUZZ
@given(texts_for("ray/*ray-status*.txt"))
def test_ray_status(text: str) -> None:
    ray_status.looks_like_ray_status(text)
    report = clean(ray_status.parse_ray_status, text, allowed=(ray_status.RayStatusError,))
    if report is not None:
        report.view()


# --- NCCL environment: env files, /proc/<pid>/environ, NCCL_* name specs ----------------------------------------


@FUZZ
@given(texts_for("nccl_env/nccl.sh"))
def test_nccl_env_file(text: str) -> None:
    parsed = nccl_env.parse_env_file(text)
    for number, problem in parsed.problems:
        assert number >= 1 and problem
    nccl_env.env_facts(nccl_env.watched(parsed.values))


@FUZZ
@given(st.binary(max_size=2048), st.text(max_size=60), st.booleans())
def test_nccl_environ_and_name_specs(data: bytes, spec: str, allow_port: bool) -> None:
    nccl_env.parse_environ(data)
    clean(lambda v: nccl_env.parse_name_spec(v, allow_port=allow_port), spec, allowed=(nccl_env.SpecError,))
    nccl_env.is_local_address(spec, {"10.0.0.1"})
    sysfs_ib.gid_is_zero(spec)


# --- log signatures, log tail positions, state files, model fingerprint ----------------------------------------

LOG_TEXTS = texts_for("logs/*.log", "logs/captured/*")


@FUZZ
@given(LOG_TEXTS, st.sampled_from([None, *signatures.LOG_KINDS]))
def test_signature_scan(text: str, kind: str | None) -> None:
    catalog = signatures.load_catalog()
    for match in scan_text(catalog, text, kind):
        assert match.code and match.line is not None


SIGNATURE_ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "code": st.one_of(st.sampled_from(["A_B", "X"]), json_values),
        "severity": st.one_of(st.sampled_from(sorted(signatures.SEVERITIES)), json_values),
        "kinds": st.one_of(st.lists(st.sampled_from(list(signatures.LOG_KINDS))), json_values),
        "title": json_values,
        "remedy": json_values,
        "patterns": st.one_of(st.lists(st.sampled_from(["(", "a+", "(?P<x>y)", "[", "ok"]), max_size=3), json_values),
        "extra": json_values,
    },
)


@FUZZ
@given(st.one_of(json_values, st.fixed_dictionaries({"signature": st.one_of(st.lists(SIGNATURE_ENTRY), json_values)})))
def test_signature_catalog(data: Any) -> None:
    clean(
        signatures.parse_catalog,
        data if isinstance(data, dict) else {"signature": data},
        allowed=(signatures.CatalogError,),
    )


@FUZZ
@given(json_values)
def test_logtail_positions(raw: Any) -> None:
    Position.from_dict(raw)
    LogFollower(raw if isinstance(raw, dict) else {"/var/log/x": raw})


@FUZZ
@given(st.one_of(st.binary(max_size=512), json_values.map(lambda v: json.dumps(v).encode())))
def test_statefile_load_of_corrupt_files(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("state") / "s.json"
    path.write_bytes(raw)
    assert isinstance(StateFile(path).load(), dict)


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", deep_json().encode(), b'{"a": 1', b""])
def test_statefile_corrupt_is_empty_state(tmp_path: Path, raw: bytes) -> None:
    # Found by the property test: invalid UTF-8 and deep nesting escaped load() instead of reading as empty.
    path = tmp_path / "s.json"
    path.write_bytes(raw)
    assert StateFile(path).load() == {}


@FUZZ
@given(
    st.lists(st.builds(fingerprint.Entry, st.text(max_size=30), st.integers(-(2**63), 2**63)), max_size=20),
    st.integers(-5, 50),
)
def test_fingerprint(entries: list[fingerprint.Entry], count: int) -> None:
    assert len(fingerprint.listing_fingerprint(entries)) == 16
    picked = fingerprint.sample_shards(entries, count)
    assert len(picked) <= max(count, 0)


def test_model_dir_with_symlink_loops_is_scanned_once(tmp_path: Path) -> None:
    # Found while reviewing the walk: two links back up the tree made os.walk(followlinks=True) take ~2^40 steps.
    (tmp_path / "sub").mkdir()
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x")
    (tmp_path / "sub" / "config.json").write_text("{}")
    for name in ("up1", "up2", "up3"):
        (tmp_path / "sub" / name).symlink_to("..")
    (tmp_path / "self").symlink_to(".")
    entries = fingerprint.scan_model_dir(tmp_path)
    assert [e.name for e in entries] == ["model-00001-of-00002.safetensors", "sub/config.json"]


def test_model_dir_lists_only_regular_files(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "model-00002-of-00002.safetensors")  # hashing it would block forever
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert [e.name for e in fingerprint.scan_model_dir(tmp_path)] == ["model-00001-of-00002.safetensors"]


# --- peers' /state documents and what the comparison does with them -------------------------------------------

GOOD_STATE = {
    "node": "dgx-a",
    "status": "ok",
    "checks": [
        {
            "name": "gpu",
            "status": "ok",
            "samples": [{"name": "dgxdoctor_gpu_power_watts", "labels": {"gpu": "0"}, "value": 1.0}],
        }
    ],
    "facts": {"driver_version": "580.1"},
}


@FUZZ
@given(st.one_of(json_mutants([GOOD_STATE]), json_values))
def test_peer_state_validation(doc: Any) -> None:
    state = clean(validate_state, doc, allowed=(BadAnswer,))
    if state is not None:
        json.dumps(state)
        compare_mod.compare([state, {**state, "node": state["node"] + "-peer"}])


@FUZZ
@given(st.one_of(st.binary(max_size=512), garbage().map(str.encode)))
def test_peer_response_json(body: bytes) -> None:
    clean(response_json, body, allowed=(BadAnswer,))


def test_peer_deeply_nested_json_is_invalid_state() -> None:
    # Found by the property test: RecursionError from json.loads escaped the peer fetch.
    with pytest.raises(BadAnswer, match="not JSON"):
        response_json(deep_json().encode())


# --- config ---------------------------------------------------------------------------------------------------

CONFIG_KEYS = st.sampled_from(["node", "paths", "daemon", "checks", "gpu", "enabled", "listen", "token", "peers", "x"])
CONFIG_DOCS = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12)),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(CONFIG_KEYS, children, max_size=4)),
    max_leaves=20,
)


@FUZZ
@given(st.dictionaries(CONFIG_KEYS, CONFIG_DOCS, max_size=5))
def test_parse_config_random_dicts(data: dict[str, Any]) -> None:
    try:
        parse_config(data, "fuzz.toml")
    except ConfigError as exc:
        assert exc.problems
        for path, reason in exc.problems:
            assert path and reason
            assert path in str(exc)


def _tables() -> st.SearchStrategy[dict[str, Any]]:
    """Config documents using the real key names, with values of any type (custom validators included)."""
    from dgxdoctor.checks.registry import ALL_CHECKS
    from dgxdoctor.config import DaemonSettings, PathsSettings

    def table(model: Any) -> st.SearchStrategy[dict[str, Any]]:
        names = sorted(model.__struct_fields__)
        value = st.one_of(json_values, st.lists(st.text(max_size=30), max_size=3))
        return st.dictionaries(st.sampled_from([*names, "no_such_key"]), value, max_size=4)

    checks = st.fixed_dictionaries({}, optional={f.name: table(f.settings_model) for f in ALL_CHECKS})
    return st.fixed_dictionaries(
        {},
        optional={
            "paths": table(PathsSettings),
            "daemon": table(DaemonSettings),
            "checks": checks,
            "node": json_values,
        },
    )


@FUZZ
@given(_tables())
def test_parse_config_real_keys_random_values(data: dict[str, Any]) -> None:
    try:
        config = parse_config(data, "fuzz.toml")
    except ConfigError as exc:
        assert exc.problems and all(path and reason for path, reason in exc.problems)
        return
    config.daemon.peers  # noqa: B018 - a config that validates is usable


# --- diagnose: every analyzer, auto-detected and forced --------------------------------------------------------

ALL_FIXTURES = texts_for(
    "kernel_log/*.txt",
    "ib/*.txt",
    "topo/*",
    "nccl_tests/*.txt",
    "vllm/*.txt",
    "ray/*.txt",
    "logs/*.log",
    "logs/captured/*",
)


@FUZZ
@given(ALL_FIXTURES)
def test_diagnose_autodetect(text: str) -> None:
    diagnosis = diagnose_text(text, ANALYZERS)
    assert diagnosis.kind
    json.dumps(diagnosis.data, default=str)


@pytest.mark.parametrize("kind", [a.kind for a in ANALYZERS])
@FUZZ
@given(ALL_FIXTURES)
def test_diagnose_forced_kind(kind: str, text: str) -> None:
    # Forced or not, an analyzer answers with findings (an UNKNOWN one for input it cannot read), never an error:
    # `dgxdoctor diagnose --kind` prints whatever it returns.
    diagnosis = diagnose_text(text, ANALYZERS, kind)
    for finding in diagnosis.findings:
        assert finding.code and finding.message


# --- more untrusted input: vLLM HTTP answers, the serving-python probe, kmsg device reads, log files ----------


@FUZZ
@given(st.one_of(json_values, json_mutants([{"object": "list", "data": [{"id": "m", "object": "model"}]}])))
def test_vllm_models_payload(payload: Any) -> None:
    from dgxdoctor.sources.vllm_api import parse_models

    clean(parse_models, payload)


@FUZZ
@given(
    st.one_of(
        json_values, json_mutants([{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 3}}])
    )
)
def test_vllm_completion_payload(payload: Any) -> None:
    from dgxdoctor.sources.vllm_api import parse_completion_tokens

    clean(parse_completion_tokens, payload)


PROBE_OUTPUT = corpus("drift/*.json")


@FUZZ
@given(st.one_of(mutated(PROBE_OUTPUT), garbage(), json_values.map(json.dumps)))
def test_serving_probe_output(stdout: str) -> None:
    from dgxdoctor.sources.serving_env import parse_probe_output

    facts = clean(parse_probe_output, stdout)
    assert facts is None or all(isinstance(v, str) for v in facts.values())


def test_serving_probe_output_deeply_nested() -> None:
    from dgxdoctor.sources.serving_env import parse_probe_output

    with pytest.raises(ValueError, match="no JSON"):
        parse_probe_output(deep_json())


@FUZZ
@given(
    st.lists(
        st.one_of(st.binary(max_size=300), mutated(corpus("kernel_log/kmsg_records_*")).map(str.encode)), max_size=20
    )
)
def test_kmsg_device_reader_on_garbage_records(chunks: list[bytes]) -> None:
    import errno

    pending = list(chunks)

    def read(fd: int, size: int) -> bytes:
        if not pending:
            raise BlockingIOError(errno.EAGAIN, "no more")
        return pending.pop(0)[:size]

    reader = kmsg.KmsgReader(Path(__file__), read=read, device=True)
    try:
        records = reader.read_available()
    finally:
        reader.close()
    assert reader.stats.records == len(records)
    assert reader.stats.records + reader.stats.malformed <= len(chunks)


POSITION_DICTS = st.fixed_dictionaries(
    {"dev": json_values, "ino": json_values, "offset": json_values}, optional={"head": json_values}
)


@FUZZ
@given(
    st.one_of(
        POSITION_DICTS, st.fixed_dictionaries({"dev": st.integers(), "ino": st.integers(), "offset": st.integers()})
    )
)
def test_logtail_position_records(raw: dict[str, Any]) -> None:
    pos = Position.from_dict(raw)
    assert pos is None or pos.offset >= 0
    LogFollower({"/var/log/x.log": raw})


@pytest.mark.parametrize("offset", [math.inf, -math.inf, math.nan, "1e999", 1e300, [1], {"a": 1}])
def test_logtail_corrupt_offset_is_dropped(offset: Any) -> None:
    # Found by the property test: int(Infinity) (json.loads reads "Infinity") raised OverflowError.
    raw = {"dev": 1, "ino": 2, "offset": offset}
    assert Position.from_dict(raw) is None or Position.from_dict(raw).offset >= 0  # type: ignore[union-attr]
    LogFollower({"/var/log/x.log": raw})


@FUZZ
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=4), st.integers(1, 4096))
def test_logtail_on_garbage_files(tmp_path_factory: pytest.TempPathFactory, writes: list[bytes], budget: int) -> None:
    path = tmp_path_factory.mktemp("logs") / "vllm.log"
    follower = LogFollower(from_start=True)
    path.write_bytes(b"")
    for data in writes:
        with path.open("ab") as fh:
            fh.write(data)
        result = follower.poll([str(path)], budget)
        assert not result.errors
        assert all(isinstance(line, str) for _, line in result.lines)
    state = follower.state()
    assert LogFollower(json.loads(json.dumps(state))).state() == state


@FUZZ
@given(
    st.one_of(st.text(max_size=12), st.sampled_from(["8M", "1G", "0", "-1", "1T", "M", "", "99999999999999999999G"]))
)
def test_allreduce_sizes(text: str) -> None:
    import argparse

    from dgxdoctor.probes.allreduce import parse_size

    clean(parse_size, text, allowed=(argparse.ArgumentTypeError,))


def test_prom_text_integer_too_large_for_a_float() -> None:
    # Found by the property test: float() of the parsed integer value raised OverflowError.
    with pytest.raises(prom_text.PromTextError, match="not valid Prometheus text"):
        prom_text.parse_prom_text("vllm:num_requests_running{} 2" + "0" * 400 + "\n")


def test_allreduce_size_with_a_superscript_digit() -> None:
    # Found by the property test: "²" passed str.isdigit() and int() raised a bare ValueError.
    import argparse

    from dgxdoctor.probes.allreduce import parse_size

    with pytest.raises(argparse.ArgumentTypeError, match="not a size"):
        parse_size("\u00b2M")


@FUZZ
@given(st.text(max_size=40))
def test_parse_listen(value: str) -> None:
    from dgxdoctor.config import parse_listen

    clean(parse_listen, value)


# --- regressions found by the property tests: numbers past int()'s 4300-digit limit, "²" passing isdigit() ----

BIG = "9" * 5000


@pytest.mark.parametrize(
    ("parse", "text", "allowed"),
    [
        (kmsg.parse_kmsg_record, f"{BIG},1,2,-;msg", kmsg.KmsgFormatError),
        (kmsg.parse_kmsg_record, f"6,{BIG},2,-;msg", kmsg.KmsgFormatError),
        (xid.parse_xid_line, f"NVRM: Xid (PCI:0000:3b:00): {BIG}, pid=1, name=x", None),
        (xid.parse_xid_line, f"NVRM: Xid (PCI:0000:3b:00): 79, pid={BIG}, name=x, GPU has fallen off the bus.", None),
        (xid.parse_xid_line, f"NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link {BIG} (0x0)", None),
        (xid.parse_sxid_line, f"nvidia-nvswitch0: SXid (PCI:0000:86:00.0): {BIG}, Non-fatal, Link 44", None),
        (xid.parse_sxid_line, f"nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link {BIG}", None),
        (
            lambda t: evaluate_topology(topo.parse_topo_matrix(t)),
            f"\tGPU0\tGPU1\nGPU0\tX\tNV{BIG}\nGPU1\tNV{BIG}\tX\n",
            topo.TopoParseError,
        ),
        (ibstat.parse_ibstat, f"CA 'mlx5_0'\n\tPort {BIG}:\n\t\tState: Active\n", ibstat.IbstatFormatError),
        (
            perfquery.parse_perfquery,
            f"# Port extended counters: Lid {BIG} port 1 (CapMask: 0x5A00)\nPortXmitData:.......1\n",
            perfquery.PerfqueryFormatError,
        ),
        (sysfs_ib.parse_state, f"{BIG}: ACTIVE", sysfs_ib.SysfsFormatError),
        (sysfs_ib.parse_phys_state, f"{BIG}: LinkUp", sysfs_ib.SysfsFormatError),
        (
            ray_status.parse_ray_status,
            f"Node status\n---\nActive:\n {BIG} node_abc\nResources\n---\n",
            ray_status.RayStatusError,
        ),
        (
            ray_status.parse_ray_status,
            "Node status\n---\nActive:\n 1 node_a\nResources\n---\nDemands:\n"
            f" {{'GPU': 1.0}}: {BIG}+ pending tasks/actors\n",
            ray_status.RayStatusError,
        ),
        (
            nccl_tests.parse_nccl_tests,
            f"# nThread 1 nGpus {BIG} minBytes 8\n# Out of bounds values : {BIG} OK\n",
            ValueError,
        ),
        (lambda v: nccl_env.parse_name_spec(v, allow_port=True), f"mlx5_0:{BIG}", nccl_env.SpecError),
        (lambda v: nccl_env.parse_name_spec(v, allow_port=True), "mlx5_0:\u00b2", nccl_env.SpecError),
    ],
)
def test_huge_and_odd_numbers_fail_cleanly(parse: Any, text: str, allowed: type[Exception] | None) -> None:
    clean(parse, text, allowed=(allowed,) if allowed else ())


@pytest.mark.parametrize("text", [f"x:{BIG}", "x:\u00b2", "x:\u0663"])
def test_parse_listen_odd_ports(text: str) -> None:
    from dgxdoctor.config import parse_listen

    with pytest.raises(ValueError, match="port must be 1-65535"):
        parse_listen(text)


@pytest.mark.parametrize("kind", [a.kind for a in ANALYZERS])
def test_diagnose_huge_numbers(kind: str) -> None:
    text = "\n".join(
        [
            f"NVRM: Xid (PCI:0000:3b:00): {BIG}, pid=1",
            f"nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 1, Non-fatal, Link {BIG}",
            f"CA 'mlx5_0'\n\tPort {BIG}:\n\t\tState: Active",
            f"\tGPU0\tGPU1\nGPU0\tX\tNV{BIG}\nGPU1\tNV{BIG}\tX",
            f"Node status\n---\nActive:\n {BIG} node_abc\nResources\n---",
        ]
    )
    diagnose_text(text, ANALYZERS, kind)


@pytest.mark.parametrize(
    ("demand", "message"),
    [
        ([{"GPU": 32.0}, math.inf], "count inf is not a number"),
        ([{"GPU": 32.0}, math.nan], "count nan is not a number"),
        ([{"CPU": {}}, 1], "resource 'CPU' is {}, not a number"),
        ([{"CPU": "abc"}, 1], "resource 'CPU' is 'abc', not a number"),
        ([{"CPU": None}, 1], "resource 'CPU' is None, not a number"),
    ],
)
def test_ray_cluster_status_bad_demand(demand: list[Any], message: str) -> None:
    # Found by the property test: int(Infinity) raised OverflowError (Python's json reads Infinity and NaN), and a
    # non-numeric resource amount raised TypeError/ValueError from float() while formatting the demand.
    doc = json.loads((FIXTURES / "ray" / "pending-cluster-status.json").read_text())
    doc["data"]["clusterStatus"]["loadMetricsReport"]["resourceDemand"] = [demand]
    with pytest.raises(ray_api.RayApiError, match=re.escape(message)):
        ray_api.parse_cluster_status(json.dumps(doc))


# --- /proc: what another user's process controls (comm, argv) and the kernel's tables -------------------------


@FUZZ
@given(
    st.one_of(garbage(), mutated([(FIXTURES / "vllm" / "proc" / "stat").read_text(errors="replace")])),
    st.one_of(st.binary(max_size=600), st.lists(st.text(max_size=30), max_size=6).map(lambda a: "\0".join(a).encode())),
)
def test_procfs_parsers(text: str, raw: bytes) -> None:
    from dgxdoctor.sources import procfs

    clean(procfs.parse_proc_stat, text, allowed=(procfs.ProcFormatError,))
    procfs.parse_btime(text)
    procfs.parse_status_uid(text)
    procfs.parse_netns_link(text)
    argv = procfs.parse_cmdline(raw)
    comm = text[:15]
    for wanted in ("vllm", "raylet", "gcs_server"):
        procfs.command_matches(wanted, comm, argv)
        procfs.runs_package(argv, wanted)


@FUZZ
@given(texts_for("ray/head-proc-net-tcp*.txt"))
def test_proc_net_tcp(text: str) -> None:
    from dgxdoctor.sources import procfs

    for socket in procfs.parse_proc_net_tcp(text):
        assert 0 <= socket.port <= 0xFFFF


# --- regressions: regexes that took quadratic time on one long line (a pasted file can hold a 64 MiB line) -----
# Each case took about a minute before its fix and takes milliseconds after; the deadline of FUZZ fails a relapse.

N_REPEATS = 60_000


@FUZZ
@given(
    st.sampled_from(
        [
            (xid.scan_text, "NVRM: Xid (PCI:0000:3b:00): 154, recovery action changed from " + " to (" * N_REPEATS),
            (ray_status.parse_ray_status, "Node status\nResources\nDemands:\n {" + " " * N_REPEATS + ": 1x\n"),
            (sysfs_ib.parse_rate, "1 Gb/sec (1X" + " " * N_REPEATS),
            (
                ray_status.parse_ray_status,
                "Node status\nResources\nDemands:\n " + "{" * N_REPEATS + "}: 1+ pending tasks/actors\n",
            ),
        ]
    )
)
def test_long_lines_take_linear_time(case: tuple[Any, str]) -> None:
    parse, text = case
    clean(parse, text)

"""The shared field types (validation.py): NcclSettings validates its URLs, hosts and sizes with them, the
peer's join request uses the same ones (what the local check accepts, the peer accepts), and the bundled
probe's own stdlib copy of the size parser and defaults agree with them."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from dgxdoctor.checks.nccl import NcclCheck, NcclSettings
from dgxdoctor.checks.nccl_run import DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.daemon.nccl_join import JoinRequest
from dgxdoctor.environment import Environment
from dgxdoctor.probes import allreduce
from dgxdoctor.validation import parse_byte_size, validate


def problems(**nccl: object) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        parse_config({"checks": {"nccl": nccl}})
    return dict(err.value.problems)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("vllm_url", "127.0.0.1:8000", "URL"),  # was taken, then swallowed as "not serving"
        ("vllm_url", "http://127.0.0.1:8000/?x=1", "query"),
        ("peer", "http://dgx-b:9835/state", "only scheme, host and port"),
        ("master_addr", "dgx-b; rm -rf /", "host name or IP"),
        ("min_bytes", "8X", "not a size"),
        ("max_bytes", "-1", "not a size"),
    ],
)
def test_nccl_settings_name_what_is_wrong(key: str, value: str, says: str) -> None:
    reason = problems(**{key: value})["checks.nccl"]
    assert f"at `$.checks.nccl.{key}`" in reason and says in reason, reason


def test_sizes_in_order() -> None:
    found = problems(min_bytes="2G", max_bytes="1G")
    assert any("larger than max_bytes" in reason for reason in found.values()), found


def test_empty_vllm_url_means_none_and_good_values_pass() -> None:
    s = validate(
        NcclSettings,
        {"vllm_url": "", "peer": "http://dgx-b:9835", "master_addr": "fe80::1", "min_bytes": "8m", "max_bytes": "1g"},
    )
    assert not s.vllm_url and s.min_bytes == "8M" and s.max_bytes == "1G"


def test_the_peer_accepts_the_join_request_the_local_check_builds() -> None:
    """A lower-case size the local check accepted was refused by the peer and read as NCCL_PEER_NOT_JOINED."""
    settings = NcclSettings(peer="http://dgx-b:9835", master_addr="dgx-a.lab", min_bytes="512k", max_bytes="8m")
    check = NcclCheck(settings, Environment(node="dgx-a"))
    request = validate(JoinRequest, check.join_request("0" * 32, None))
    assert (request.min_bytes, request.max_bytes, request.master_addr) == ("512K", "8M", "dgx-a.lab")


@pytest.mark.parametrize("text", ["8", "8M", "8m", "8MB", "512K", "1G", "1073741824", "x", "8X", "", "²"])
def test_the_probe_reads_sizes_as_the_settings_do(text: str) -> None:
    try:
        ours: int | None = parse_byte_size(text)
    except ValueError:
        ours = None
    try:
        probes: int | None = allreduce.parse_size(text)
    except argparse.ArgumentTypeError:
        probes = None
    assert ours == probes


def test_the_probe_sizes_are_one_default() -> None:
    args = allreduce._parser().parse_args([])
    assert (args.min_bytes, args.max_bytes) == (parse_byte_size(DEFAULT_MIN_BYTES), parse_byte_size(DEFAULT_MAX_BYTES))
    assert (NcclSettings().min_bytes, NcclSettings().max_bytes) == (DEFAULT_MIN_BYTES, DEFAULT_MAX_BYTES)
    assert (
        JoinRequest.__struct_defaults__[
            JoinRequest.__struct_fields__.index("min_bytes") - len(JoinRequest.__struct_fields__)
        ]
        == DEFAULT_MIN_BYTES
    )


def test_remediation_targets_are_the_checks_settings() -> None:
    """Remediation re-typed vLLM's URL and a 10 s timeout (the check says 5 s); now it reads the settings."""
    from dgxdoctor.checks.vllm import VllmSettings
    from dgxdoctor.daemon.remediation import targets_for

    default = targets_for(parse_config({}), None)
    assert default.vllm.request_timeout_s == VllmSettings().request_timeout_s
    config = parse_config(
        {
            "checks": {
                "vllm": {"base_url": "http://10.0.0.5:8001", "request_timeout_s": 7},
                "ray": {"dashboard_url": "http://10.0.0.5:8265", "expected_nodes": 3, "expected_gpus": 24},
            }
        }
    )
    t = targets_for(config, None)
    assert (t.vllm.base_url, t.vllm.request_timeout_s) == ("http://10.0.0.5:8001", 7)
    assert (t.ray_dashboard_url, t.ray_nodes, t.ray_gpus) == ("http://10.0.0.5:8265", 3, 24)


@pytest.mark.parametrize("text", ["1", "8m", "8MB", "512k", "16G", "16g", "0", "17G", "16385M", "8X", "-1", " 8M "])
def test_the_peer_and_the_config_accept_the_same_probe_sizes(text: str) -> None:
    """One parser and one bound (1 B .. 16G) for the config's sizes and a peer's join request."""
    request = {"run_id": "0" * 32, "master_addr": "10.0.0.1", "master_port": 29555, "nnodes": 2, "node_rank": 1,
               "join_timeout_s": 60}  # fmt: skip

    def accepted(make: Callable[[], object]) -> str | None:
        try:
            make()
        except ValueError as exc:  # msgspec's ValidationError is a ValueError
            return "refused: outside" if "outside 1 B .. 16G" in str(exc) else "refused"
        return None

    local = accepted(lambda: validate(NcclSettings, {"min_bytes": "1", "max_bytes": text}))
    peer = accepted(lambda: validate(JoinRequest, {**request, "min_bytes": "1", "max_bytes": text}))
    assert local == peer
    assert (local is None) == (text.strip().upper() in ("1", "8M", "8MB", "512K", "16G"))


def test_one_size_parser() -> None:
    """checks/nccl.py had its own (size_bytes, check_size_range, SIZE_RE): every size goes through validation.py."""
    import re
    from pathlib import Path

    from dgxdoctor.checks import nccl

    assert not {"size_bytes", "check_size_range", "SIZE_RE", "SIZE_UNITS"} & set(vars(nccl))
    src = Path(nccl.__file__).parents[1]
    size_regex = re.compile(r"\[KMG\]")
    owners = sorted(
        str(p.relative_to(src)) for p in src.rglob("*.py") if size_regex.search(p.read_text(encoding="utf-8"))
    )
    assert owners == ["validation.py"]  # probes/allreduce.py keeps a stdlib copy, held equal above


def _settings_fields() -> list[tuple[type, str]]:
    from msgspec import Struct
    from msgspec.structs import fields

    from dgxdoctor.commands.config_doc import bare_type
    from dgxdoctor.config import config_model

    seen: list[tuple[type, str]] = []
    todo: list[type[Struct]] = [config_model()]
    while todo:
        model = todo.pop()
        for field in fields(model):
            name, inner = field.name, bare_type(field.type)
            if isinstance(inner, type) and issubclass(inner, Struct):
                todo.append(inner)
            elif name.endswith(("_url", "_addr")) or name in ("peer", "peers"):
                seen.append((model, name))
    return seen


@pytest.mark.parametrize(("model", "key"), _settings_fields(), ids=lambda x: getattr(x, "__name__", x))
def test_every_url_and_host_setting_is_validated(model: type, key: str) -> None:
    """A URL without a scheme (or a host with a shell in it) is a config error in every table, not a later
    "not serving" or "unreachable"."""
    bad = "dgx-b; rm -rf /" if key.endswith("_addr") else "127.0.0.1:8000"
    value: object = [bad] if key == "peers" else bad
    with pytest.raises(ValueError, match=key):
        validate(model, {key: value})


BYTE_COUNTS = [
    ("bundle", "size_cap_bytes"),
    ("checks.logs", "max_bytes_per_run"),
    ("checks.logs", "check_window_bytes"),
    ("checks.drift", "hash_bytes_per_run"),
    ("checks.host", "weights_bytes"),
    ("checks.ras", "max_bytes"),
]


def _table(path: str, key: str, value: object) -> dict[str, object]:
    doc: dict[str, object] = {key: value}
    for part in reversed(path.split(".")):
        doc = {part: doc}
    return doc


@pytest.mark.parametrize(("table", "key"), BYTE_COUNTS)
def test_every_byte_count_takes_a_size_as_the_probe_does(table: str, key: str) -> None:
    """One byte-size parser for every setting: "64M" is 64 MiB wherever a number of bytes is asked for."""
    config = parse_config(_table(table, key, "64M"))
    section = config.model
    for part in table.split("."):
        section = getattr(section, part)
    assert getattr(section, key) == 64 << 20
    with pytest.raises(ConfigError) as err:
        parse_config(_table(table, key, "64X"))
    reason = dict(err.value.problems)[table]
    assert "not a size" in reason and f"at `$.{table}.{key}`" in reason, reason

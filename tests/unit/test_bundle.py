"""``dgxdoctor bundle``: every kind of secret planted where a bundle reads, then the archive grepped for each; the
manifest's per-file record; the size cap and the deadline, both reported when hit; a peer's part read back."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from dgxdoctor.bundle.archive import BadPart, part_bytes, read_part
from dgxdoctor.bundle.build import build_bundle
from dgxdoctor.bundle.collect import Item, Output, Part, collect
from dgxdoctor.bundle.items import Sources
from dgxdoctor.bundle.redact import Redactor
from dgxdoctor.commands.bundle import parse_duration
from dgxdoctor.config import Config, parse_config
from dgxdoctor.sources.commands import CommandNotFound, CommandResult, CommandTimeout
from proctree import write_process

TOKEN = "daemon-token-PLANTED-0123456789"
# Each kind of secret, planted once, with where it goes.
PLANTED = {
    "daemon token": TOKEN,
    "vLLM api key": "vllm-key-PLANTED-abcdef",
    "HF_TOKEN in a log": "hf_PLANTEDabcdefghijklmnopqrstuv",
    "HF_TOKEN in a process environment": "hf_PLANTEDenvironABCDEFGHIJKLMN",
    "AWS key id in a process environment": "AKIAPLANTED000000000",
    "AWS secret key in the NCCL env file": "wJalrXUtnPLANTEDbPxRfiCYEXAMPLEKEY",
    "password in a URL": "hunter2PLANTED",
    "password in a process environment": "dbpwPLANTED99",
    "bearer token in the audit": "auditBearerPLANTED777",
    "redis password on a command line": "redisPLANTED555",
}


class FakeRunner:
    """The command runner seam: nvidia-smi and ray as a node without GPUs and with Ray would answer."""

    def __init__(self, slow: set[str] | None = None) -> None:
        self.slow = slow or set()
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] in self.slow:
            time.sleep(min(timeout_s, 5))
            raise CommandTimeout(f"{argv[0]} did not finish in {timeout_s:g} s")
        if argv[0] == "nvidia-smi":
            raise CommandNotFound("nvidia-smi not found in PATH")
        if argv[-1] == "status":
            text = "======== Autoscaler status ========\nActive:\n 1 node_a\n 1 node_b\n"
            text += f"raylet --redis-password={PLANTED['redis password on a command line']} --port 6379\n"
            return CommandResult(tuple(argv), 0, text, "")
        return CommandResult(tuple(argv), 1, "", "ibstat: no devices")


def planted_node(tmp: Path) -> Config:
    state = tmp / "state"
    state.mkdir()
    (state / "remediation.jsonl").write_text(
        json.dumps({"event": "action", "detail": f"Authorization: Bearer {PLANTED['bearer token in the audit']}"})
        + "\n"
    )
    log = tmp / "vllm.log"
    log.write_text(
        f"INFO starting with HF_TOKEN={PLANTED['HF_TOKEN in a log']}\n"
        f"INFO proxy https://admin:{PLANTED['password in a URL']}@proxy:3128 in use\n"
        f"INFO api key {PLANTED['vLLM api key']} loaded\n"
    )
    env_file = tmp / "nccl.sh"
    env_file.write_text(
        "export NCCL_SOCKET_IFNAME=ens1f0\n"
        f"export AWS_SECRET_ACCESS_KEY={PLANTED['AWS secret key in the NCCL env file']}\n"
    )
    proc = tmp / "proc"
    d = write_process(proc, 4242, "raylet", ["/opt/vllm/bin/raylet", "--node-ip-address=10.0.0.2"])
    (d / "environ").write_bytes(
        b"\0".join(
            [
                b"NCCL_IB_HCA=mlx5_0,mlx5_1",
                f"HF_TOKEN={PLANTED['HF_TOKEN in a process environment']}".encode(),
                f"AWS_ACCESS_KEY_ID={PLANTED['AWS key id in a process environment']}".encode(),
                f"DB_PASSWORD={PLANTED['password in a process environment']}".encode(),
            ]
        )
    )
    kmsg = tmp / "kmsg.txt"
    kmsg.write_text("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n")
    return parse_config(
        {
            "node": "dgx-b",
            "paths": {"state_dir": str(state), "proc_root": str(proc), "kmsg_path": str(kmsg),
                      "sysfs_root": str(tmp / "sys")},
            "daemon": {"token": TOKEN},
            "checks": {
                "logs": {"vllm_paths": [str(log)], "ray_paths": []},
                "nccl_env": {"env_file": str(env_file)},
                "vllm": {"api_key": PLANTED["vLLM api key"]},
            },
        }
    )  # fmt: skip


def sources(results: dict[str, Any] | None = None) -> Sources:
    doc = results or {"node": "dgx-b", "status": "critical", "checks": [], "config": {"token": TOKEN}}
    return Sources(lambda: doc, lambda: {"node": "dgx-b", "checks": []}, 3600.0, bug_report=False)


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]


def test_no_planted_secret_reaches_the_archive(tmp_path: Path) -> None:
    config = planted_node(tmp_path)
    env = replace(config.environment(), run_command=FakeRunner())
    out = tmp_path / "b.tar.gz"
    _, top = build_bundle(config, env, sources(), out, 30.0, (), "dgxdoctor bundle")
    files = members(out)
    everything = b"\n".join(files.values())
    # The grep: not one planted value, raw or in any file of the archive.
    leaked = {kind: value for kind, value in PLANTED.items() if value.encode() in everything}
    assert leaked == {}
    assert b"PLANTED" not in everything
    # What was around them is still there, so the bundle stays useful.
    assert b"NCCL_IB_HCA=mlx5_0,mlx5_1" in everything and b"HF_TOKEN=<redacted>" in everything
    assert b"GPU has fallen off the bus" in files["b/dgx-b/kernel.log"]
    assert b"--redis-password=<redacted>" in files["b/dgx-b/ray-status.txt"]
    assert top["nodes"][0]["node"] == "dgx-b"


def test_the_manifest_records_every_file(tmp_path: Path) -> None:
    config = planted_node(tmp_path)
    runner = FakeRunner()
    env = replace(config.environment(), run_command=runner)
    out = tmp_path / "b.tar.gz"
    build_bundle(config, env, sources(), out, 30.0, (), "dgxdoctor bundle")
    files = members(out)
    manifest = json.loads(files["b/dgx-b/manifest.json"])
    entries = {e["file"]: e for e in manifest["files"]}
    assert set(entries) >= {
        "results.json", "state.json", "kernel.log", "nvidia-smi-q.txt", "nvidia-smi-topo-m.txt", "infiniband.txt",
        "ray-status.txt", "nccl-env.txt", "versions.json", "remediation-audit.jsonl", "config.json",
        "logs/vllm/vllm.log",
    }  # fmt: skip
    for name, entry in entries.items():
        if entry["status"] == "ok":
            assert entry["bytes"] == len(files[f"b/dgx-b/{name}"]), name
    assert entries["ray-status.txt"]["command"] == ["ray", "status"] and entries["ray-status.txt"]["exit_code"] == 0
    assert entries["nvidia-smi-q.txt"]["status"] == "missing" and "not found" in entries["nvidia-smi-q.txt"]["error"]
    assert entries["infiniband.txt"]["status"] == "failed" and entries["infiniband.txt"]["exit_code"] == 1
    failed = {f["file"] for f in manifest["failures"]}
    assert {"nvidia-smi-q.txt", "infiniband.txt", "remediation-state.json"} <= failed
    assert ["nvidia-smi", "-q"] in runner.calls  # argv through the runner, never a shell string
    top = json.loads(files["b/manifest.json"])
    assert any("nvidia-smi-q.txt: missing" in f for f in top["failures"])


def test_the_deadline_is_kept_and_reported(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck(_left: float) -> Output:
        release.wait(30)
        return Output(b"late")

    items = [Item("fast.txt", "echo", lambda left: Output(b"fast")), Item("stuck.txt", "read a dead NFS file", stuck)]
    t0 = time.monotonic()
    part = collect("dgx-a", items, 0.5, 10**6, Redactor())
    took = time.monotonic() - t0
    release.set()
    assert took < 3.0
    entries = {e["file"]: e for e in part.manifest["files"]}
    assert entries["fast.txt"]["status"] == "ok"
    assert entries["stuck.txt"]["status"] == "timeout" and "deadline" in entries["stuck.txt"]["error"]
    assert part.manifest["limits"]["deadline_hit"] is True


def test_a_command_gets_no_more_than_what_is_left(tmp_path: Path) -> None:
    config = planted_node(tmp_path)
    runner = FakeRunner(slow={"ray"})
    env = replace(config.environment(), run_command=runner)
    out = tmp_path / "b.tar.gz"
    t0 = time.monotonic()
    build_bundle(config, env, sources(), out, 1.0, (), "dgxdoctor bundle")
    assert time.monotonic() - t0 < 4.0
    manifest = json.loads(members(out)["b/dgx-b/manifest.json"])
    ray = next(e for e in manifest["files"] if e["file"] == "ray-status.txt")
    assert ray["status"] == "timeout"


def test_the_size_cap_cuts_and_says_so() -> None:
    items = [
        Item("results.json", "x", lambda left: Output(b"r" * 600)),
        Item("vllm.log", "x", lambda left: Output(b"old " * 100 + b"NEWEST LINE")),
        Item("late.txt", "x", lambda left: Output(b"t" * 100)),
    ]
    part = collect("dgx-a", items, 5.0, 700, Redactor())
    files = dict(part.files)
    assert len(files["results.json"]) == 600
    assert files["vllm.log"].endswith(b"NEWEST LINE") and len(files["vllm.log"]) == 100  # a log keeps its end
    assert "late.txt" not in files
    entries = {e["file"]: e for e in part.manifest["files"]}
    assert entries["vllm.log"]["bytes_before_cap"] == 411 and "size cap" in entries["vllm.log"]["error"]
    assert entries["late.txt"]["bytes"] == 0 and entries["late.txt"]["bytes_before_cap"] == 100
    assert part.manifest["limits"] == {"size_cap_bytes": 700, "size_cap_hit": True, "deadline_s": 5.0,
                                       "deadline_hit": False}  # fmt: skip


def test_a_peers_part_is_checked_before_it_is_kept() -> None:
    part = Part("dgx-b", [("results.json", b"{}")], {"node": "dgx-b", "files": []})
    back = read_part(part_bytes(part), 10**6)
    assert back.node == "dgx-b" and back.files == [("results.json", b"{}")]
    for name in ("../../etc/cron.d/x", "/etc/passwd", "a/../../b"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(BadPart, match="unexpected member"):
            read_part(buf.getvalue(), 10**6)
    with pytest.raises(BadPart, match="more than 10 bytes"):
        read_part(part_bytes(Part("x", [("big.txt", b"y" * 100)], {"node": "x", "files": []})), 10)
    with pytest.raises(BadPart, match=r"not a tar\.gz"):
        read_part(b"<html>proxy error</html>", 10**6)


@pytest.mark.parametrize(
    ("text", "seconds"), [("900", 900.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0),
                          ("1h30m", 5400.0)]
)  # fmt: skip
def test_since_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "5 m", "0", "1w"])
def test_bad_since_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_every_daemon_token_is_redacted(tmp_path: Path) -> None:
    """The read and alert tokens are secrets too: a log line quoting any of the three keeps none of them."""
    tokens = {name: f"PLANTED{name}tok{i}x" * 2 for i, name in enumerate(("read", "alert", "peer"))}
    files = {}
    for name, value in tokens.items():
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(value + "\n")
        files[name].chmod(0o600)
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"INFO a curl with {value} in it\n" for value in tokens.values()))
    (tmp_path / "state").mkdir()
    config = parse_config(
        {
            "node": "dgx-b",
            "paths": {"state_dir": str(tmp_path / "state"), "proc_root": str(tmp_path / "proc"),
                      "kmsg_path": str(tmp_path / "kmsg"), "sysfs_root": str(tmp_path / "sys")},
            "daemon": {f"{name}_token_file": str(path) for name, path in files.items()},
            "checks": {"logs": {"vllm_paths": [str(log)], "ray_paths": []}},
        }
    )  # fmt: skip
    out = tmp_path / "b.tar.gz"
    build_bundle(config, replace(config.environment(), run_command=FakeRunner()), sources(), out, 30.0, (), "bundle")
    everything = b"\n".join(members(out).values())
    assert b"INFO a curl with" in everything
    assert not [name for name, value in tokens.items() if value.encode() in everything]

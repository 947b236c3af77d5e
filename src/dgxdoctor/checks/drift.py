"""`drift`: the facts two nodes must agree on (kernel, serving stack versions, model files), for comparison.

By hand, on each node: ``uname -r``; ``<serving python> -m pip list | grep -E 'vllm|ray|torch|nccl'``;
``ls -lR /models/glm | md5sum`` and ``sha256sum`` of a few shards (the tutorial's step 5).

With ``[node] container`` and no ``serving_python``, the probe runs in the container (``docker exec NAME
/usr/bin/python3 -I -c ...``, the interpreter of its vLLM server): a host path there is another machine's.

Driver and CUDA versions come from the gpu check and the NCCL environment from the nccl_env check; this check
adds the rest. It never fails on its own: what it cannot read is reported as unknown (an OK finding) and left
out of the facts, and the peer comparison decides what a difference means.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.drift import model_dir_missing
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S, HOUR_S
from dgxdoctor.sources.commands import CommandNotFound, CommandTimeout, python_argv
from dgxdoctor.sources.container import serving, serving_python_in
from dgxdoctor.sources.fingerprint import ShardHasher, listing_fingerprint, sample_shards, scan_model_dir
from dgxdoctor.sources.serving_env import DISTRIBUTIONS, PROBE, find_serving_python, parse_probe_output
from dgxdoctor.validation import ByteCount

NODE_INFO = MetricSpec(
    "dgxdoctor_node_info",
    "Software versions on this node that must match across the serving nodes (empty label: unknown).",
    "info",
    ("kernel_release", "vllm_version", "ray_version", "torch_version", "nccl_version", "python_version"),
)
MODEL_INFO = MetricSpec(
    "dgxdoctor_model_info",
    "Fingerprint of the model directory: sha256 of its sorted file names and sizes (first 16 hex digits).",
    "info",
    ("model_dir", "fingerprint"),
)
VERSION_KEYS = ("kernel_release", *DISTRIBUTIONS, "python_version")


class HashBytes(ByteCount):
    """Shard bytes hashed in one run: 1 B .. 1 TiB."""

    low = 1
    high = 1 << 40


class DriftSettings(CheckSettings, frozen=True):
    """The drift check: versions and model files to compare between the nodes."""

    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 300.0
    serving_python: Annotated[
        str | None,
        Meta(
            description="Python interpreter of the vLLM/Ray install (e.g. /opt/vllm/.venv/bin/python); "
            "default: the executable of a running vLLM or Ray Python process; with [node] container, the "
            "container's vLLM Python, run through `docker exec`"
        ),
    ] = None
    probe_timeout_s: Annotated[
        float, Meta(gt=0, le=HOUR_S, description="seconds allowed for the serving python's version probe")
    ] = 10.0
    model_dir: Annotated[Path | None, Meta(description="model directory to fingerprint (same path on every node)")] = (
        None
    )
    sample_shards: Annotated[
        int,
        Meta(
            ge=0,
            le=100000,
            description="sha256 this many *.safetensors shards (first and last by name, then evenly spaced); "
            "0 = names and sizes only",
        ),
    ] = 0
    hash_bytes_per_run: Annotated[
        HashBytes,
        Meta(
            description="read at most this many shard bytes per run (a number or a size: 256M); "
            "a hash completes over runs"
        ),
    ] = HashBytes(256 * 1024 * 1024)


class DriftCheck(Check[DriftSettings]):
    name: ClassVar[str] = "drift"
    probes: ClassVar[tuple[str, ...]] = ("version probe",)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        self._hasher = ShardHasher()

    def run(self) -> CheckResult:
        b = ResultBuilder(self.name)
        facts: dict[str, str] = {}
        kernel = self._kernel_release()
        if kernel:
            facts["kernel_release"] = kernel
        else:
            b.add(Finding("DRIFT_UNKNOWN", Status.OK, "kernel release unreadable", "kernel_release"))
        facts.update(self._versions(b))
        for key in VERSION_KEYS:
            if key not in facts and key != "kernel_release":
                b.add(Finding("DRIFT_UNKNOWN", Status.OK, f"{key} unknown", key))
        b.sample(NODE_INFO, 1, **{key: facts.get(key, "") for key in NODE_INFO.labels})
        self._model(b, facts)
        b.facts.update(facts)
        return b.build(_summary(facts, b))

    def _kernel_release(self) -> str | None:
        try:
            return (self.env.proc_root / "sys/kernel/osrelease").read_text().strip() or None
        except OSError:
            # Only the real /proc may fall back to the running kernel; a test root stands for another machine.
            return os.uname().release if self.env.proc_root == Path("/proc") else None

    def _versions(self, b: ResultBuilder) -> dict[str, str]:
        s = self.settings
        python = s.serving_python
        argv: list[str] | None = None
        box = self.env.container
        if python is None and box is not None:  # the serving stack is the container's: asked there
            boxed = serving(self.env.run_command, self.env.proc_root, box)
            python = serving_python_in(boxed.server)
            argv = box.exec_argv(*python_argv(python, "-c", PROBE))
            python = f"{python} in container {box.name}"
        elif python is None:
            found = find_serving_python(self.env.proc_root)
            if found is None:
                b.add(
                    Finding(
                        "SERVING_PYTHON_UNKNOWN",
                        Status.OK,
                        "no serving_python configured and no running vLLM or Ray Python process found",
                        remedy="set checks.drift.serving_python to the vLLM environment's python",
                    )
                )
                return {}
            python = found.exe
        try:
            done = self.env.run_command(argv or python_argv(python, "-c", PROBE), s.probe_timeout_s)
        except (CommandNotFound, CommandTimeout, OSError) as exc:
            if isinstance(exc, CommandTimeout):
                b.timed_out("version probe")
            b.add(Finding("SERVING_PYTHON_UNKNOWN", Status.OK, f"cannot run {python}: {exc}", python))
            return {}
        if done.returncode != 0:
            b.add(
                Finding(
                    "SERVING_PYTHON_UNKNOWN",
                    Status.OK,
                    f"{python} version probe exited {done.returncode}: {done.stderr.strip()[-200:]}",
                    python,
                )
            )
            return {}
        try:
            return parse_probe_output(done.stdout)
        except ValueError as exc:
            b.add(Finding("SERVING_PYTHON_UNKNOWN", Status.OK, str(exc), python))
            return {}

    def _model(self, b: ResultBuilder, facts: dict[str, str]) -> None:
        s = self.settings
        if s.model_dir is None:
            b.add(Finding("MODEL_DIR_UNKNOWN", Status.OK, "no model_dir configured: model files not fingerprinted"))
            return
        root = s.model_dir
        if not root.is_dir():
            b.add(model_dir_missing(str(root)))
            facts["model_fingerprint"] = "missing"
            b.sample(MODEL_INFO, 1, model_dir=str(root), fingerprint="missing")
            return
        entries = scan_model_dir(root)
        fingerprint = listing_fingerprint(entries)
        facts["model_fingerprint"] = fingerprint
        facts["model_files"] = str(len(entries))
        facts["model_bytes"] = str(sum(e.size for e in entries))
        b.sample(MODEL_INFO, 1, model_dir=str(root), fingerprint=fingerprint)
        shards = sample_shards(entries, s.sample_shards)
        if not shards:
            return
        digests = self._hasher.advance([root / e.name for e in shards], s.hash_bytes_per_run)
        pending = []
        for entry in shards:
            digest = digests.get(str(root / entry.name))
            if digest is None:
                pending.append(entry.name)
            else:
                facts[f"model_shard_sha256.{entry.name}"] = digest
        if pending:
            b.add(
                Finding(
                    "MODEL_SHARDS_HASHING",
                    Status.OK,
                    f"sha256 of {len(pending)} sampled shard(s) still in progress "
                    f"({s.hash_bytes_per_run} bytes per run): {', '.join(pending)}",
                    str(root),
                )
            )


def _summary(facts: dict[str, str], b: ResultBuilder) -> str:
    """What is known (with its value), what is missing and why (the first reason found for it)."""
    known = [f"{k} {facts[k]}" for k in VERSION_KEYS if k in facts]
    missing = [k for k in VERSION_KEYS if k not in facts]
    summary = f"known: {', '.join(known) if known else 'nothing'}"
    if missing:
        why = next((f.message for f in b.findings if f.code == "SERVING_PYTHON_UNKNOWN"), None)
        summary += f"; missing: {', '.join(missing)} ({why or 'not found in the serving Python'})"
    if "model_fingerprint" in facts:
        summary += f"; model {facts['model_fingerprint']}"
    return summary

"""Render a layout plan: the table an operator reads and the ``--json`` document."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Any

from dgxdoctor.judge.plan import GIB, Layout, Plan
from dgxdoctor.sources.nvml import NvmlClient, NvmlError


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def plan_dict(plan: Plan) -> dict[str, Any]:
    s, cfg = plan.shape, plan.settings
    return {
        "model": {
            "path": plan.model_path,
            "architectures": list(s.architectures),
            "model_type": s.model_type,
            "layers": s.num_layers,
            "attention_heads": s.num_heads,
            "kv_heads": s.num_kv_heads,
            "attention": s.attention,
            "head_dim": s.head_dim,
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "vocab_size": s.vocab_size,
            "experts": s.num_experts,
            "experts_per_token": s.experts_per_token,
            "dtype": s.dtype,
            "quantization": s.quant_method,
            "kv_lora_rank": s.kv_lora_rank,
            "weight_bytes": plan.weight_bytes,
            "weight_source": plan.weight_source,
            "notes": list(s.notes),
        },
        "settings": {
            "nodes": cfg.nodes,
            "gpus_per_node": cfg.gpus_per_node,
            "gpu_memory_bytes": cfg.gpu_memory_bytes,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "max_model_len": plan.max_model_len,
            "kv_cache_dtype": cfg.kv_cache_dtype,
            "overhead_bytes_per_gpu": cfg.overhead_bytes,
            "network_gbps": cfg.network_gbps,
        },
        "layouts": [lay.to_dict() for lay in plan.layouts],
        "one_node_layouts": [lay.to_dict() for lay in plan.one_node_layouts],
        "recommended": plan.recommended.name if plan.recommended else None,
        "replicas": plan.replicas if plan.recommended else 0,
        "reasons": list(plan.reasons),
        "vllm_serve": list(plan.serve_argv),
    }


def _verdict(layout: Layout) -> str:
    if layout.fits:
        return "ok"
    return "INVALID" if not layout.valid else "NO ROOM"


def plan_text(plan: Plan) -> str:
    s, cfg = plan.shape, plan.settings
    moe = f", MoE {s.num_experts} experts / {s.experts_per_token} per token" if s.is_moe else ""
    quant = f", {s.quant_method}" if s.quant_method else ""
    lines = [
        f"{plan.model_path}: {', '.join(s.architectures) or s.model_type}",
        f"  {s.num_layers} layers, {s.num_heads} heads, {s.num_kv_heads} KV heads ({s.attention}), head dim "
        f"{s.head_dim}{moe}, {s.dtype}{quant}",
        f"  weights {_gib(plan.weight_bytes)} GiB ({plan.weight_source}); max model len {plan.max_model_len}; "
        f"KV cache {cfg.kv_cache_dtype}",
        f"  {cfg.nodes} node(s) x {cfg.gpus_per_node} GPUs of {_gib(cfg.gpu_memory_bytes)} GiB, "
        f"utilization {cfg.gpu_memory_utilization:g}, assumed activation/runtime margin {_gib(cfg.overhead_bytes)} "
        "GiB per GPU",
        "",
        f"{'LAYOUT':<10} {'VERDICT':<8} {'WEIGHTS/GPU':>11} {'KV/TOKEN/GPU':>12} {'KV CACHE/GPU':>12} "
        f"{'TOKENS':>10} {'SEQS':>6}",
    ]
    lines += _layout_rows(plan.layouts)
    if plan.one_node_layouts:
        lines += ["", f"on one node ({cfg.gpus_per_node} GPUs), for one replica per node:"]
        lines += _layout_rows(plan.one_node_layouts)
    lines.append("")
    head = f"recommended: {plan.recommended.name}" if plan.recommended else "recommended: none fits"
    if plan.recommended and plan.replicas > 1:
        head += f" on each node, {plan.replicas} replicas"
    lines.append(head)
    for reason in plan.reasons:
        lines.extend(textwrap.wrap(reason, 110, initial_indent="  - ", subsequent_indent="    "))
    if plan.serve_argv:
        lines += ["", plan.serve_command + ("    # on each node" if plan.replicas > 1 else "")]
    return "\n".join(lines)


def _layout_rows(layouts: Sequence[Layout]) -> list[str]:
    lines = []
    for lay in layouts:
        budget = min((st.kv_budget_bytes_per_gpu for st in lay.stages), default=0)
        lines.append(
            f"{lay.name:<10} {_verdict(lay):<8} {_gib(lay.weight_bytes_per_gpu) + ' GiB':>11} "
            f"{str(lay.kv_bytes_per_token_per_gpu) + ' B':>12} {_gib(max(budget, 0)) + ' GiB':>12} "
            f"{lay.kv_tokens:>10} {lay.sequences:>6}"
        )
        for text in [p.message for p in lay.problems] + list(lay.notes):
            lines.extend(textwrap.wrap(text, 110, initial_indent="    - ", subsequent_indent="      "))
    return lines


# "GB" as NVIDIA's product names use it: an "80GB" H100 or A100 reports 81559 MiB through NVML, a "141GB" H200
# 143771 MiB: the nominal GiB less ~0.44 % the driver keeps. 80e9 bytes (74.5 GiB) would undercount by 5 GiB.
NVIDIA_GB = GIB * 81559 / 81920
_UNITS = {
    "": GIB,
    "gib": GIB,
    "g": GIB,
    "gb": NVIDIA_GB,
    "mib": 1 << 20,
    "mb": 10**6,
    "tib": 1 << 40,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory(text: str) -> int:
    """``141``, ``141GiB``, ``80GB`` (NVIDIA's GB: see NVIDIA_GB), ``143771MiB`` -> bytes (a bare number is GiB);
    ValueError naming the input."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or len(match.group(1)) > 15:
        raise ValueError(f"not a memory size: {text!r} (e.g. 141, 141GiB, 80GB, 143771MiB)")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory size must be positive: {text!r}")
    return value


def smallest_gpu_memory(client: NvmlClient) -> tuple[int, int]:
    """(total bytes of the smallest GPU, GPU count) through NVML; the client is initialised and shut down here."""
    client.init()
    try:
        count = client.device_count()
        if count == 0:
            raise NvmlError("NVML sees no GPU")
        return min(client.memory_info(i)[1] for i in range(count)), count
    finally:
        client.shutdown()

"""How to cut a model over the GPUs: every TP x PP layout judged by vLLM's own rules, its memory, and a choice.

The rules are vLLM's (0.32), each named with where vLLM enforces it:

- attention heads divisible by TP: ``ModelConfig.verify_with_parallel_config`` (``vllm/config/model.py``), a
  ValueError before anything loads. The runbook's error 3.
- KV heads divisible by TP, or TP by KV heads (KV heads are then replicated): ``QKVParallelLinear``
  (``vllm/model_executor/layers/linear.py``, ``divide()``), an AssertionError while the model is built. Not for
  multi-head latent attention (MLA), whose compressed KV is one "head" replicated on every TP rank.
- the dense MLP's intermediate size divisible by TP: ``MergedColumnParallelLinear`` (``divide()`` again).
- FP8 block-quantized weights: every TP shard a whole number of blocks (``validate_fp8_block_shape`` and
  ``validate_fp8_block_shape_moe``, ``vllm/model_executor/layers/quantization/utils/fp8_utils.py``).
- layers over PP stages: vLLM does not require divisibility. ``get_pp_indices`` (``vllm/distributed/utils.py``)
  gives the remainder to the stages before the last; only a stage without layers is refused here.
- memory: vLLM asks for ``total x gpu_memory_utilization`` per GPU, takes weights and the profiled activation
  peak off it, and the rest is KV cache (``vllm/v1/worker/gpu_worker.py``). Nothing left is "No available memory
  for the cache blocks" (runbook error 4); less than one ``max_model_len`` sequence is "To serve at least one
  request with the model's max seq len ..." (``vllm/v1/core/kv_cache_utils.py``). The activation and runtime peak
  is not knowable from a config: it is an assumed margin (``overhead_bytes``), shown with every figure.

The choice follows the runbook's step 1: tensor parallelism over every GPU (TP16 on two 8-GPU nodes) when the
heads divide and the fabric between the nodes is fast; otherwise TP within a node and PP across nodes (TP8 x PP2),
which sends far less over the network at the cost of a pipeline bubble.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from msgspec import Struct, field

from dgxdoctor.sources.hf_model import QUANT_WEIGHT_BYTES, ModelShape

GIB = 1 << 30
BLOCK_TOKENS = 16  # vLLM's default KV block size on CUDA: capacity is counted in whole blocks
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
DEFAULT_OVERHEAD_GIB = 4.0
DEFAULT_FAST_NETWORK_GBPS = 800.0  # RDMA per node; the runbook calls a single 100G port "limited"
FEW_SEQUENCES = 8  # fewer full-length sequences than this in the KV cache: say so
# A split that holds this many times the full-length sequences of the other split is chosen over it (TP16's
# replicated KV heads can halve the cache: Llama-3.1-70B's 8 KV heads on 16 GPUs hold 10 sequences, TP8xPP2 21).
CAPACITY_GAIN = 1.5


class PlanSettings(Struct, frozen=True):
    """The cluster and the serving flags a plan is made for."""

    gpu_memory_bytes: int
    nodes: int = 2
    gpus_per_node: int = 8
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    overhead_bytes: int = int(DEFAULT_OVERHEAD_GIB * GIB)
    network_gbps: float | None = None
    fast_network_gbps: float = DEFAULT_FAST_NETWORK_GBPS

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("nodes and gpus per node must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu memory utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.gpu_memory_bytes <= 0:
            raise ValueError("GPU memory must be positive")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv cache dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max model len must be at least 1")
        if self.overhead_bytes < 0:
            raise ValueError("the overhead margin must not be negative")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class Problem(Struct, frozen=True):
    """Why vLLM refuses a layout: a code, vLLM's own words, and where vLLM checks it."""

    code: str
    message: str
    where: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "where": self.where}


class Stage(Struct, frozen=True):
    """One pipeline stage, as seen by each of its TP GPUs."""

    index: int
    layers: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_tokens: int


class Layout(Struct, frozen=True):
    tp: int
    pp: int
    problems: tuple[Problem, ...]
    stages: tuple[Stage, ...]
    kv_bytes_per_token: int
    max_model_len: int
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"TP{self.tp}" if self.pp == 1 else f"TP{self.tp}xPP{self.pp}"

    @property
    def valid(self) -> bool:
        """vLLM accepts the shapes (memory and the asked length aside)."""
        return not any(p.code not in NOT_SHAPE_CODES for p in self.problems)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def weight_bytes_per_gpu(self) -> int:
        return max(s.weight_bytes_per_gpu for s in self.stages) if self.stages else 0

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        return max(s.kv_bytes_per_token_per_gpu for s in self.stages) if self.stages else 0

    @property
    def kv_tokens(self) -> int:
        return min(s.kv_tokens for s in self.stages) if self.stages else 0

    @property
    def sequences(self) -> int:
        return self.kv_tokens // self.max_model_len

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.name,
            "tp": self.tp,
            "pp": self.pp,
            "valid": self.valid,
            "fits": self.fits,
            "problems": [p.to_dict() for p in self.problems],
            "pp_layers": [s.layers for s in self.stages],
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_cache_bytes_per_gpu": min((s.kv_budget_bytes_per_gpu for s in self.stages), default=0),
            "kv_tokens": self.kv_tokens,
            "full_length_sequences": self.sequences,
            "notes": list(self.notes),
        }


MEMORY_CODES = frozenset({"NO_KV_CACHE_MEMORY", "KV_CACHE_TOO_SMALL"})
NOT_SHAPE_CODES = MEMORY_CODES | {"MAX_MODEL_LEN_TOO_LONG"}


class Plan(Struct, frozen=True):
    shape: ModelShape
    model_path: str
    settings: PlanSettings
    max_model_len: int
    weight_bytes: int
    weight_source: str
    layouts: tuple[Layout, ...]
    recommended: Layout | None
    reasons: tuple[str, ...]
    serve_argv: tuple[str, ...] = field(default_factory=tuple)
    # One replica per node (the recommended layout over one node's GPUs) when the model fits one node well.
    replicas: int = 1
    # The layouts over one node's GPUs (judged when there is more than one node).
    one_node_layouts: tuple[Layout, ...] = ()

    @property
    def serve_command(self) -> str:
        return shlex.join(self.serve_argv)


def layer_split(layers: int, pp: int) -> list[int]:
    """vLLM's ``get_pp_indices`` without VLLM_PP_LAYER_PARTITION: the remainder goes to the stages before the last."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


SERVING_DTYPE_BYTES = 2  # vLLM's --dtype auto serves in 16 bits (a float32 checkpoint is cast to bfloat16/float16)


def model_bytes_per_param(shape: ModelShape) -> float:
    return QUANT_WEIGHT_BYTES.get(shape.quant_method or "", float(SERVING_DTYPE_BYTES))


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """``auto`` stores the KV cache in the serving dtype (16 bits), not at the weights' quantized width."""
    return 1 if kv_cache_dtype.startswith("fp8") else SERVING_DTYPE_BYTES


def _attention_params(s: ModelShape) -> int:
    if s.mla:
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = (
            s.hidden_size * s.q_lora_rank + s.q_lora_rank * s.num_heads * qk
            if s.q_lora_rank
            else s.hidden_size * s.num_heads * qk
        )
        kv_a = s.hidden_size * ((s.kv_lora_rank or 0) + s.qk_rope_head_dim)
        kv_b = (s.kv_lora_rank or 0) * s.num_heads * (s.qk_nope_head_dim + s.v_head_dim)
        return q + kv_a + kv_b + s.num_heads * s.v_head_dim * s.hidden_size
    qkv = s.hidden_size * (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    return qkv + s.num_heads * s.head_dim * s.hidden_size


def estimate_weight_bytes(s: ModelShape) -> int:
    """Weights from the config alone (embeddings in the model dtype, the big matrices at the quantized width).
    Used only when neither a safetensors index nor the files are at hand."""
    dense_mlp = 3 * s.hidden_size * s.intermediate_size
    moe_layers = max(0, s.num_layers - s.first_dense_layers) if s.is_moe else 0
    expert_size = s.moe_intermediate_size or s.intermediate_size
    moe_mlp = (s.num_experts + s.shared_experts) * 3 * s.hidden_size * expert_size + s.hidden_size * s.num_experts
    big = s.num_layers * _attention_params(s) + (s.num_layers - moe_layers) * dense_mlp + moe_layers * moe_mlp
    return int(big * model_bytes_per_param(s) + _embedding_bytes(s))


def _embedding_bytes(s: ModelShape) -> int:
    """Input embedding plus output head (unless tied), in the model dtype."""
    one = s.vocab_size * s.hidden_size * SERVING_DTYPE_BYTES
    return one if s.tie_word_embeddings else 2 * one


def shape_problems(s: ModelShape, tp: int, pp: int) -> list[Problem]:
    """vLLM's refusals that depend only on the model's shape and the layout (memory aside)."""
    problems: list[Problem] = []
    if s.num_heads % tp:
        problems.append(
            Problem(
                "HEADS_NOT_DIVISIBLE",
                f"Total number of attention heads ({s.num_heads}) must be divisible by tensor parallel size ({tp}).",
                "vllm/config/model.py ModelConfig.verify_with_parallel_config",
            )
        )
    kv = s.num_kv_heads
    if not s.mla and kv and ((tp >= kv and tp % kv) or (tp < kv and kv % tp)):
        problems.append(
            Problem(
                "KV_HEADS_NOT_DIVISIBLE",
                f"{kv} KV heads and tensor parallel size {tp}: neither divides the other "
                f"({max(tp, kv)} is not divisible by {min(tp, kv)})",
                "vllm/model_executor/layers/linear.py QKVParallelLinear (divide)",
            )
        )
    has_dense_mlp = not s.is_moe or s.first_dense_layers > 0
    if has_dense_mlp and s.intermediate_size % tp:
        problems.append(
            Problem(
                "INTERMEDIATE_NOT_DIVISIBLE",
                f"{s.intermediate_size} is not divisible by {tp} (the MLP's intermediate size over TP)",
                "vllm/model_executor/layers/linear.py MergedColumnParallelLinear (divide)",
            )
        )
    problems += _fp8_block_problems(s, tp, has_dense_mlp)
    if pp > s.num_layers:
        problems.append(
            Problem(
                "PP_EXCEEDS_LAYERS",
                f"{pp} pipeline stages for {s.num_layers} layers: a stage would hold no layer",
                "vllm/distributed/utils.py get_pp_indices",
            )
        )
    return problems


def _fp8_block_problems(s: ModelShape, tp: int, has_dense_mlp: bool) -> list[Problem]:
    if s.weight_block_size is None or tp == 1:
        return []
    block_n, block_k = s.weight_block_size
    where = "vllm/model_executor/layers/quantization/utils/fp8_utils.py validate_fp8_block_shape"
    sizes: list[tuple[str, int]] = []
    if has_dense_mlp:
        sizes.append(("dense MLP", s.intermediate_size))
    if s.is_moe:
        sizes.append(("expert", s.moe_intermediate_size or s.intermediate_size))
    for what, size in sizes:
        shard = size // tp
        if size % tp == 0 and shard % block_n == 0 and shard % block_k == 0:
            continue
        message = (
            f"Weight output_partition_size = {shard} is not divisible by weight quantization block_n = {block_n}."
            if shard % block_n
            else f"Weight input_size_per_partition = {shard} is not divisible by weight quantization "
            f"block_k = {block_k}."
        )
        return [Problem("FP8_BLOCK_NOT_DIVISIBLE", f"{what} intermediate {size} / TP {tp}: {message}", where)]
    return []


def kv_bytes_per_token_per_gpu(s: ModelShape, tp: int, layers: int, kv_bytes: int) -> tuple[int, int]:
    """(full-attention bytes per token, sliding-window bytes per token) on one GPU of a stage of ``layers``.

    MLA caches one compressed vector (kv_lora_rank + rope dims) per layer, the same on every TP rank; other
    attention caches K and V for max(1, kv_heads // tp) heads (vLLM's ``get_num_kv_heads``).
    """
    if s.mla:
        return s.head_dim * layers * kv_bytes, 0
    per_layer = 2 * max(1, s.num_kv_heads // tp) * s.head_dim * kv_bytes
    sliding = round(layers * s.sliding_layers / s.num_layers) if s.sliding_layers else 0
    return per_layer * (layers - sliding), per_layer * sliding


def judge_layout(
    s: ModelShape, weight_bytes: int, tp: int, pp: int, settings: PlanSettings, max_model_len: int
) -> Layout:
    """One layout: vLLM's shape rules, then each stage's weights, KV cache budget and capacity."""
    problems = shape_problems(s, tp, pp)
    kv_bytes = kv_dtype_bytes(settings.kv_cache_dtype)
    embed = _embedding_bytes(s)
    per_layer = max(0, weight_bytes - embed) / s.num_layers
    one_embed = embed if s.tie_word_embeddings else embed / 2
    requested = int(settings.gpu_memory_bytes * settings.gpu_memory_utilization)
    stages: list[Stage] = []
    split = layer_split(s.num_layers, pp) if pp <= s.num_layers else [1] * pp
    for index, layers in enumerate(split):
        stage_weights = layers * per_layer + (one_embed if index == 0 else 0) + (one_embed if index == pp - 1 else 0)
        weights = int(stage_weights / tp)
        full, sliding = kv_bytes_per_token_per_gpu(s, tp, layers, kv_bytes)
        budget = requested - weights - settings.overhead_bytes
        window = min(s.sliding_window or 0, max_model_len)
        per_token = full + sliding * window / max_model_len
        tokens = int(budget // per_token) // BLOCK_TOKENS * BLOCK_TOKENS if budget > 0 and per_token else 0
        stages.append(Stage(index, layers, weights, full + sliding, budget, tokens))
    layout = Layout(tp, pp, (), tuple(stages), _model_kv_bytes(s, tp, pp, kv_bytes), max_model_len)
    problems += _memory_problems(layout)
    notes = []
    if pp > 1 and s.num_layers % pp:
        notes.append(f"layers split unevenly over the stages: {split} (vLLM's default partition)")
    if not s.mla and tp > s.num_kv_heads and tp % s.num_kv_heads == 0:
        notes.append(f"{s.num_kv_heads} KV heads on {tp} GPUs: each KV head is replicated {tp // s.num_kv_heads}x")
    if s.mla and tp > 1:
        notes.append(
            f"MLA: each of the {tp} TP ranks caches the same latent vector, so TP does not shrink the KV cache"
        )
    return Layout(tp, pp, tuple(problems), tuple(stages), layout.kv_bytes_per_token, max_model_len, tuple(notes))


def _model_kv_bytes(s: ModelShape, tp: int, pp: int, kv_bytes: int) -> int:
    """KV bytes one token takes over all the GPUs of the layout (replicas included)."""
    return sum(kv_bytes_per_token_per_gpu(s, tp, layers, kv_bytes)[0] for layers in layer_split(s.num_layers, pp)) * tp


def _memory_problems(layout: Layout) -> list[Problem]:
    where = "vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory"
    worst = min(layout.stages, key=lambda st: st.kv_budget_bytes_per_gpu)
    if worst.kv_budget_bytes_per_gpu <= 0:
        return [
            Problem(
                "NO_KV_CACHE_MEMORY",
                f"No available memory for the cache blocks: weights take {worst.weight_bytes_per_gpu / GIB:.1f} GiB "
                f"per GPU, {-worst.kv_budget_bytes_per_gpu / GIB:.1f} GiB more than the budget leaves",
                where,
            )
        ]
    if layout.kv_tokens < layout.max_model_len:
        return [
            Problem(
                "KV_CACHE_TOO_SMALL",
                f"To serve at least one request with the model's max seq len ({layout.max_model_len}), the KV cache "
                f"must hold {layout.max_model_len} tokens; it holds {layout.kv_tokens}",
                where,
            )
        ]
    return []


def divisor_pairs(world: int) -> list[tuple[int, int]]:
    """Every (TP, PP) with TP x PP = world, largest TP first."""
    return [(tp, world // tp) for tp in range(world, 0, -1) if world % tp == 0]


def recommend(
    layouts: list[Layout], settings: PlanSettings, one_node: Sequence[Layout] = (), shape: ModelShape | None = None
) -> tuple[Layout | None, int, list[str]]:
    """(layout, replicas, reasons): the runbook's step 1 weighed with the table's own numbers.

    More than one node: one replica per node when the model fits one node with room (no all-reduce on the network);
    else the split over all nodes that holds the most full-length sequences, TP across nodes only on a fabric known
    fast (vLLM's docs: TP = GPUs per node, PP = nodes; the runbook: TP16 first on a fast RDMA fabric).
    """
    reasons: list[str] = []
    if settings.nodes > 1:
        single = _best_within_node(one_node)
        split, split_reasons = _split_choice({(lay.tp, lay.pp): lay for lay in layouts}, settings)
        if single is not None and single.sequences >= FEW_SEQUENCES:
            reasons.append(
                f"{single.name} fits one node of {settings.gpus_per_node} GPUs with {single.sequences} full-length "
                f"sequences: serve one replica per node ({settings.nodes} replicas behind a load balancer): no "
                f"all-reduce crosses the network, and {settings.nodes}x the throughput of one replica split over them"
            )
            if split is not None:
                reasons.append(f"to split one replica over the {settings.nodes} nodes instead: " + split_reasons[-1])
            return single, settings.nodes, reasons + _capacity_reasons(single) + _moe_reasons(single, shape)
        if single is not None:
            reasons.append(
                f"not one replica per node: {single.name} holds only {single.sequences} full-length sequences"
            )
        elif one_node:
            reasons.append("not one replica per node: no layout fits on one node")
        reasons += split_reasons
        if split is not None:
            return split, 1, reasons + _capacity_reasons(split) + _moe_reasons(split, shape)
    choice = _best_within_node([lay for lay in layouts if lay.fits], settings.gpus_per_node) or max(
        (lay for lay in layouts if lay.fits), key=lambda lay: lay.tp, default=None
    )
    if choice is None:
        return None, 1, reasons + _nothing_fits(layouts, settings)
    reasons.append(f"{choice.name}: the largest TP that is valid and fits")
    return choice, 1, reasons + _capacity_reasons(choice) + _moe_reasons(choice, shape)


def _best_within_node(layouts: Sequence[Layout], per_node: int | None = None) -> Layout | None:
    """The fitting layout with the largest TP (TP within a node when ``per_node`` is given), fewer stages first."""
    fitting = [
        lay for lay in layouts if lay.fits and (per_node is None or (lay.tp <= per_node and per_node % lay.tp == 0))
    ]
    return max(fitting, key=lambda lay: (lay.tp, -lay.pp), default=None)


def _split_choice(by_shape: dict[tuple[int, int], Layout], settings: PlanSettings) -> tuple[Layout | None, list[str]]:
    """TP over every GPU or TP within a node x PP across the nodes, each with the sentence that chose it."""
    full = by_shape[(settings.world_size, 1)]
    node = by_shape.get((settings.gpus_per_node, settings.nodes))
    fast, slow, network = _network(settings)
    if full.fits and node is not None and node.fits:
        if node.sequences >= CAPACITY_GAIN * full.sequences:
            return node, [
                f"{node.name}: it holds {node.sequences} full-length sequences, {full.name} "
                f"{full.sequences} ({_kv_replication(full)}); TP within each node over NVLink, PP across"
            ]
        if fast:
            return full, [f"{full.name}: the heads divide, it fits ({full.sequences} sequences), and {network}"]
        return node, [
            f"{node.name}: TP = GPUs per node and PP = nodes (vLLM's advice) since {network}; {full.name} also fits "
            f"({full.sequences} sequences against {node.sequences}) and is the runbook's first choice on a fabric "
            f"known fast (--network-gbps {settings.fast_network_gbps:g} or more)"
        ]
    if node is not None and node.fits:
        why = _why_not(full) if not full.fits else network
        return node, [f"not {full.name}: {why}", f"{node.name}: TP within each node over NVLink, PP across the nodes"]
    if full.fits:
        caution = f"; caution: {network}" if slow else ""
        why = f"not {node.name}: {_why_not(node)}" if node is not None else "no TP-per-node split over these GPUs"
        return full, [why, f"{full.name}: the only split over every node that fits{caution}"]
    said = [f"not {full.name}: {_why_not(full)}"] + ([f"not {node.name}: {_why_not(node)}"] if node else [])
    return None, said


def _kv_replication(layout: Layout) -> str:
    replicated = [n for n in layout.notes if "replicated" in n or n.startswith("MLA:")]
    return replicated[0] if replicated else "the pipeline stages split the layers' KV cache"


def _network(settings: PlanSettings) -> tuple[bool, bool, str]:
    """(known fast, known slow, the sentence): an unknown fabric is neither, and is never assumed fast."""
    given, fast = settings.network_gbps, settings.fast_network_gbps
    if given is None:
        return False, False, f"the network speed is not given (--network-gbps; TP across nodes needs {fast:g} Gb/s)"
    if given >= fast:
        return True, False, f"the fabric gives {given:g} Gb/s per node (fast: >= {fast:g})"
    return (
        False,
        True,
        (
            f"the fabric gives {given:g} Gb/s per node, under {fast:g}: cross-node TP would send every layer's "
            "all-reduce over it"
        ),
    )


def _moe_reasons(layout: Layout, shape: ModelShape | None) -> list[str]:
    if shape is None or not shape.is_moe or layout.tp < 2:
        return []
    return [
        f"MoE with {shape.num_experts} experts: --enable-expert-parallel places whole experts on the {layout.tp} TP "
        "ranks instead of slicing every expert (vLLM's expert parallelism); try it when the expert layers dominate"
    ]


def _why_not(layout: Layout) -> str:
    return "; ".join(p.message.rstrip(".") for p in layout.problems)


def _capacity_reasons(layout: Layout) -> list[str]:
    if layout.sequences >= FEW_SEQUENCES:
        return []
    return [
        f"only {layout.sequences} full-length sequence(s) fit in the KV cache: more concurrent requests wait. In the "
        "runbook's order: --kv-cache-dtype fp8, a shorter --max-model-len, then --gpu-memory-utilization"
    ]


def _nothing_fits(layouts: list[Layout], settings: PlanSettings) -> list[str]:
    valid = [lay for lay in layouts if lay.valid]
    if not valid:
        return ["no layout passes vLLM's shape rules on this many GPUs: use a GPU count the heads divide"]
    too_long = next((p for lay in valid for p in lay.problems if p.code == "MAX_MODEL_LEN_TOO_LONG"), None)
    if too_long is not None:
        return [f"--max-model-len is refused whatever the layout: {too_long.message}"]
    best = max(valid, key=lambda lay: lay.kv_tokens)
    tips = [f"no valid layout leaves room for one {best.max_model_len}-token sequence; the best is {best.name}"]
    if best.kv_tokens > 0:
        tips.append(f"{best.name} holds {best.kv_tokens} tokens: --max-model-len {best.kv_tokens} would start")
    if settings.kv_cache_dtype == "auto":
        tips.append("--kv-cache-dtype fp8 halves the KV cache per token")
    if best.kv_tokens == 0:
        tips.append("the weights alone overfill the GPUs: more nodes, or a quantized checkpoint (FP8)")
    return tips


def serve_argv(model_path: str, layout: Layout, settings: PlanSettings, shape: ModelShape) -> tuple[str, ...]:
    argv = ["vllm", "serve", model_path, "--tensor-parallel-size", str(layout.tp)]
    if layout.pp > 1:
        argv += ["--pipeline-parallel-size", str(layout.pp)]
    if settings.nodes > 1 and layout.tp * layout.pp > settings.gpus_per_node:
        argv += ["--distributed-executor-backend", "ray"]  # the runbook: without it the worker node sits idle
    argv += ["--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}"]
    argv += ["--max-model-len", str(layout.max_model_len)]
    if settings.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", settings.kv_cache_dtype]
    if shape.trust_remote_code:
        argv.append("--trust-remote-code")
    return tuple(argv)


def make_plan(
    shape: ModelShape, model_path: str, weight_bytes: int | None, weight_source: str | None, settings: PlanSettings
) -> Plan:
    """Every layout over ``settings.world_size`` GPUs, judged; the recommended one and its ``vllm serve`` line.

    ValueError when no maximum length is known (the config gives none and none was asked for).
    """
    max_len = settings.max_model_len or shape.max_model_len
    if max_len is None:
        raise ValueError("config.json gives no maximum length (max_position_embeddings): pass --max-model-len")
    if weight_bytes is None:
        weight_bytes, weight_source = estimate_weight_bytes(shape), "estimate"
    layouts = _judged(shape, weight_bytes, settings, max_len, settings.world_size)
    one_node = _judged(shape, weight_bytes, settings, max_len, settings.gpus_per_node) if settings.nodes > 1 else []
    choice, replicas, reasons = recommend(layouts, settings, one_node, shape)
    argv = serve_argv(model_path, choice, settings, shape) if choice is not None else ()
    return Plan(
        shape,
        model_path,
        settings,
        max_len,
        weight_bytes,
        weight_source or "estimate",
        tuple(layouts),
        choice,
        tuple(reasons),
        argv,
        replicas,
        tuple(one_node),
    )


def _judged(shape: ModelShape, weight_bytes: int, settings: PlanSettings, max_len: int, gpus: int) -> list[Layout]:
    layouts = [judge_layout(shape, weight_bytes, tp, pp, settings, max_len) for tp, pp in divisor_pairs(gpus)]
    too_long = _max_len_problem(shape, settings)
    return layouts if too_long is None else [_with_problem(lay, too_long) for lay in layouts]


def _max_len_problem(shape: ModelShape, settings: PlanSettings) -> Problem | None:
    asked, derived = settings.max_model_len, shape.max_model_len
    if asked is None or derived is None or asked <= derived:
        return None
    return Problem(
        "MAX_MODEL_LEN_TOO_LONG",
        f"User-specified max_model_len ({asked}) is greater than the derived max_model_len "
        f"({shape.max_model_len_key}={derived} in model's config.json)",
        "vllm/config/model.py _get_and_verify_max_len",
    )


def _with_problem(layout: Layout, problem: Problem) -> Layout:
    return Layout(
        layout.tp,
        layout.pp,
        (problem, *layout.problems),
        layout.stages,
        layout.kv_bytes_per_token,
        layout.max_model_len,
        layout.notes,
    )

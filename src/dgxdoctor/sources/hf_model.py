"""A Hugging Face model directory, read the way vLLM reads it: ``config.json`` and the weights' real size.

By hand: ``python3 -m json.tool MODEL/config.json`` and ``python3 -c "import json; print(json.load(open(
'MODEL/model.safetensors.index.json'))['metadata']['total_size'])"``.

The attribute names and their order of precedence are vLLM's (``vllm/transformers_utils/
model_arch_config_convertor.py`` in vllm 0.32: ``get_total_num_kv_heads``, ``get_head_size``, ``get_num_experts``,
``is_deepseek_mla``, ``derive_max_model_len_and_key``), so the numbers here are the ones vLLM will use. Pure
``parse_*`` functions; ``read_model`` is the only one that touches the disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from msgspec import Struct, field

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config.json is a few KiB; a 4 MiB one is not a config
MAX_INDEX_BYTES = 64 * 1024 * 1024  # DeepSeek-V3's index (91k tensors) is ~9 MiB

# vLLM's lists, in its order (first present wins).
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "top_k_experts", "moe_topk", "moe_top_k")
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# model_type values vLLM treats as multi-head latent attention (when kv_lora_rank is set).
MLA_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_mtp",
        "kimi_k2",
        "kimi_linear",
        "longcat_flash",
        "pangu_ultra_moe",
        "glm_moe_dsa",
        "glm4_moe_lite",
        "glm5_next",
        "glm5_next_text",
    }
)
# Sub-configs that hold the language model of a multimodal checkpoint (transformers' get_text_config()).
TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")

# Bytes per weight of the big matrices under each quantization method (scales included, roughly).
QUANT_WEIGHT_BYTES = {
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "modelopt": 1.0,
    "compressed-tensors": 1.0,
    "mxfp4": 0.53,  # 4 bits + one 8-bit scale per 32 weights
    "modelopt_fp4": 0.56,
    "awq": 0.53,
    "gptq": 0.53,
    "awq_marlin": 0.53,
    "gptq_marlin": 0.53,
    "bitsandbytes": 0.53,
}


class ModelConfigError(ValueError):
    """A config.json (or its index) that cannot be used, with what is wrong in the message."""


class ModelShape(Struct, frozen=True):
    """What a layout plan needs from ``config.json``, in vLLM's terms."""

    architectures: tuple[str, ...]
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    dtype: str
    max_model_len: int | None
    max_model_len_key: str | None
    tie_word_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int | None = None
    shared_experts: int = 0
    first_dense_layers: int = 0
    quant_method: str | None = None
    weight_block_size: tuple[int, int] | None = None
    mla: bool = False
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0
    trust_remote_code: bool = False
    notes: tuple[str, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention(self) -> str:
        if self.mla:
            return "MLA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA" if self.num_kv_heads < self.num_heads else "MHA"

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers - self.sliding_layers


WeightSource = Literal["index", "files", "estimate"]


class ModelFiles(Struct, frozen=True):
    """A model as read from disk: its shape, and the weights' size with where that figure came from."""

    path: Path
    shape: ModelShape
    weight_bytes: int | None
    weight_source: WeightSource | None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = cfg.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{key} must be an integer, got {value!r}")
    if value < 0:
        raise ModelConfigError(f"{key} must not be negative, got {value}")
    return value


def _first_int(cfg: dict[str, Any], keys: tuple[str, ...]) -> tuple[int | None, str | None]:
    for key in keys:
        if cfg.get(key) is not None:
            value = cfg[key]
            if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
                value = max(value)  # per-layer lists (Ernie's experts): vLLM takes one value
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelConfigError(f"{key} must be a non-negative integer, got {value!r}")
            return value, key
    return None, None


def text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (the whole config unless it is multimodal)."""
    for key in TEXT_CONFIG_KEYS:
        sub = data.get(key)
        if isinstance(sub, dict) and "num_attention_heads" in sub:
            return sub
    return data


def _required(cfg: dict[str, Any], key: str) -> int:
    value = _int(cfg, key)
    if value is None or value == 0:
        raise ModelConfigError(f"config.json has no {key}: not a decoder language model this plan understands")
    return value


def _dtype(data: dict[str, Any], cfg: dict[str, Any]) -> str:
    for source in (data, cfg):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value.removeprefix("torch.")
    return "unset"  # vLLM then reads the dtype from the safetensors headers


def _quantization(data: dict[str, Any], cfg: dict[str, Any]) -> tuple[str | None, tuple[int, int] | None]:
    quant = data.get("quantization_config") or data.get("compression_config") or cfg.get("quantization_config")
    if quant is None:
        return None, None
    if not isinstance(quant, dict):
        raise ModelConfigError(f"quantization_config must be an object, got {type(quant).__name__}")
    method = str(quant.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")
    block = quant.get("weight_block_size")
    if block is not None:
        ok = isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
        if not ok:
            raise ModelConfigError(f"quantization_config.weight_block_size must be two positive integers: {block!r}")
        return method or None, (block[0], block[1])
    return method or None, None


def _max_len(cfg: dict[str, Any]) -> tuple[int | None, str | None]:
    """vLLM's ``derive_max_model_len_and_key``: the smallest of the length keys present."""
    best: tuple[int | None, str | None] = (None, None)
    for key in MAX_LEN_KEYS:
        value = cfg.get(key)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value > 0
            and (best[0] is None or value < best[0])
        ):
            best = (value, key)
    if isinstance(cfg.get("model_max_length"), int) and cfg["model_max_length"] > 0:
        best = (cfg["model_max_length"], "model_max_length")
    return best


# RoPE types whose max_position_embeddings is already the scaled length (vLLM's _get_and_verify_max_len).
PRESCALED_ROPE = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default"})


def _rope_factor(cfg: dict[str, Any], model_type: str) -> float:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict) or "gemma3" in model_type:
        return 1.0
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    factor = rope.get("factor")
    if rope_type in PRESCALED_ROPE or not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0:
        return 1.0
    return float(factor)


def _head_dim(cfg: dict[str, Any], hidden: int, heads: int, mla: bool) -> int:
    if mla:
        return (_int(cfg, "kv_lora_rank") or 0) + (_int(cfg, "qk_rope_head_dim") or 0)
    head_dim = cfg.get("head_dim")
    if isinstance(head_dim, int) and not isinstance(head_dim, bool) and head_dim > 0:
        return head_dim
    per_head = cfg.get("hidden_size_per_head")
    if isinstance(per_head, int) and per_head > 0:
        return per_head
    return hidden // heads


def _sliding(cfg: dict[str, Any], layers: int) -> tuple[int | None, int]:
    """(window, how many layers use it) from ``layer_types``; a window without per-layer types counts as none
    (every layer is then sized as full attention: an upper bound on the KV cache)."""
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or not isinstance(layer_types, list):
        return None, 0
    count = sum(1 for t in layer_types[:layers] if t == "sliding_attention")
    return (window, count) if count else (None, 0)


def _architectures(data: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    architectures = data.get("architectures") or cfg.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelConfigError(f"architectures must be a list of names, got {architectures!r}")
    return architectures


def parse_model_config(data: Any) -> ModelShape:
    """A parsed config.json -> ModelShape; ModelConfigError naming the missing or bad key."""
    if not isinstance(data, dict):
        raise ModelConfigError(f"config.json must hold a JSON object, got {type(data).__name__}")
    cfg = text_config(data)
    hidden = _required(cfg, "hidden_size")
    layers = _required(cfg, "num_hidden_layers")
    heads = _required(cfg, "num_attention_heads")
    kv_heads, _ = _first_int(cfg, KV_HEAD_KEYS)
    if data.get("model_type") == "falcon" and not cfg.get("new_decoder_architecture") and cfg.get("multi_query"):
        kv_heads = 1
    model_type = str(cfg.get("model_type") or data.get("model_type") or "")
    mla = model_type in MLA_MODEL_TYPES and cfg.get("kv_lora_rank") is not None
    experts, _ = _first_int(cfg, EXPERT_KEYS)
    per_token, _ = _first_int(cfg, EXPERTS_PER_TOKEN_KEYS)
    if per_token is None:
        per_token = _int(cfg, "experts_per_token")  # gpt-oss spells it so beside num_experts_per_tok
    quant_method, block = _quantization(data, cfg)
    max_len, max_len_key = _max_len(cfg)
    if max_len is not None:
        max_len = int(max_len * _rope_factor(cfg, model_type))
    window, sliding_layers = _sliding(cfg, layers)
    architectures = _architectures(data, cfg)
    vocab = _int(cfg, "vocab_size") or 0
    notes: list[str] = []
    if sliding_layers:
        notes.append(f"{sliding_layers} of {layers} layers use a sliding window of {window} tokens")
    return ModelShape(
        architectures=tuple(architectures),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads if kv_heads else heads,
        head_dim=_head_dim(cfg, hidden, heads, mla),
        vocab_size=vocab,
        intermediate_size=_int(cfg, "intermediate_size") or _int(cfg, "ffn_hidden_size") or 4 * hidden,
        dtype=_dtype(data, cfg),
        max_model_len=max_len,
        max_model_len_key=max_len_key,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", data.get("tie_word_embeddings", False))),
        num_experts=experts or 0,
        experts_per_token=per_token or 0,
        moe_intermediate_size=_int(cfg, "moe_intermediate_size"),
        shared_experts=_int(cfg, "n_shared_experts") or 0,
        first_dense_layers=_int(cfg, "first_k_dense_replace") or 0,
        quant_method=quant_method,
        weight_block_size=block,
        mla=mla,
        kv_lora_rank=_int(cfg, "kv_lora_rank") if mla else None,
        q_lora_rank=_int(cfg, "q_lora_rank") if mla else None,
        qk_rope_head_dim=(_int(cfg, "qk_rope_head_dim") or 0) if mla else 0,
        qk_nope_head_dim=(_int(cfg, "qk_nope_head_dim") or 0) if mla else 0,
        v_head_dim=(_int(cfg, "v_head_dim") or 0) if mla else 0,
        sliding_window=window,
        sliding_layers=sliding_layers,
        trust_remote_code="auto_map" in data,
        notes=tuple(notes),
    )


def parse_index_total_size(data: Any) -> int | None:
    """``model.safetensors.index.json`` -> ``metadata.total_size`` in bytes; None when absent or 0 (a stub)."""
    if not isinstance(data, dict):
        raise ModelConfigError("the safetensors index must hold a JSON object")
    metadata = data.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ModelConfigError("the safetensors index's metadata must be an object")
    total = metadata.get("total_size")
    if total is None:
        return None
    if isinstance(total, bool) or not isinstance(total, int | float) or total < 0:
        raise ModelConfigError(f"metadata.total_size must be a byte count, got {total!r}")
    return int(total) or None


def _load_json(path: Path, limit: int) -> Any:
    try:
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise ModelConfigError(f"{path}: larger than {limit // 2**20} MiB, not a model config")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ModelConfigError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise ModelConfigError(f"{path}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def read_model(path: Path) -> ModelFiles:
    """``path`` is a model directory or its ``config.json``. The weight size comes from the safetensors index,
    else from the ``*.safetensors`` files beside the config; None when neither is there."""
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.exists():
        raise ModelConfigError(f"{config_path}: no such file" + (" (not a model directory)" if path.is_dir() else ""))
    shape = parse_model_config(_load_json(config_path, MAX_CONFIG_BYTES))
    folder = config_path.parent
    notes: list[str] = []
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        total = parse_index_total_size(_load_json(index, MAX_INDEX_BYTES))
        if total is not None:
            return ModelFiles(config_path, shape, total, "index")
        notes.append(f"{index.name} gives no total_size")
    files = sorted(folder.glob("*.safetensors"))
    if files:
        try:
            size = sum(f.stat().st_size for f in files)
        except OSError as exc:
            raise ModelConfigError(f"cannot stat the safetensors files in {folder}: {exc}") from None
        return ModelFiles(config_path, shape, size, "files", tuple(notes))
    return ModelFiles(config_path, shape, None, None, tuple(notes))

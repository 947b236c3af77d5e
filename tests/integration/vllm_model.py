"""A tiny random-weight Llama model that vLLM's CPU build can serve, made offline (no model hub is reachable).

``build_tiny_model(python, dest)`` runs this file with the vLLM venv's python (the test venv has no torch):
LlamaForCausalLM with hidden 64, 2 layers, 2 heads of head_dim 32 (vLLM's CPU attention takes head sizes 32, 64,
80, ... but not 16), vocab 512, random weights as safetensors, and a byte-level BPE tokenizer trained on a few lines
of text, wrapped as a fast tokenizer with a chat template. Outputs are gibberish; requests use ``ignore_eos`` to get
a known number of tokens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

VOCAB = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Two DGX nodes serve one model with tensor parallelism over InfiniBand.",
    "vLLM keeps a paged KV cache; when it is full, requests wait or are preempted.",
    "Health checks report ok, warning, critical, unknown or skipped.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?-_'\"()[]{}<>/\\|@#$%^&*+=~`",
]


def build_tiny_model(python: Path, dest: Path, timeout_s: float = 300) -> Path:
    """Write the model into ``dest`` (created) using ``python`` (one with torch, transformers, tokenizers)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(python), str(Path(__file__).resolve()), str(dest)],
        check=True,
        timeout=timeout_s,
        capture_output=True,
        text=True,
    )
    return dest


def _main(dest: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<unk>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=32,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(dest, safe_serialization=True)


if __name__ == "__main__":
    _main(Path(sys.argv[1]))

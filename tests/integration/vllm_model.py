"""A small random-weight Llama model that vLLM's CPU build can serve, made offline (no model hub is reachable).

Run with the vLLM venv's python (the test venv has no torch): ``python vllm_model.py DEST_DIR``.
LlamaForCausalLM with hidden 512, 4 layers, 16 heads of head_dim 32 (vLLM's CPU attention takes head sizes 32, 64,
80, ... but not 16), vocab 512, random weights as safetensors (44 MB), and a byte-level BPE tokenizer trained on a
few lines of text, wrapped as a fast tokenizer with a chat template. Building it takes ~5 s.

Why not smaller: with hidden 64 the engine outruns the API server on a 2-core machine (tokenizing and detokenizing
dominate), the engine idles between requests and the queue never builds up. At this size the engine is the
bottleneck (~700 tokens/s), so concurrent requests really wait and fill the KV cache, as on a loaded GPU server.
Outputs are gibberish; requests use ``ignore_eos`` to get a known number of tokens.
"""

from __future__ import annotations

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

"""Mistral 7B (v0.1-v0.3): Llama's layers, with a sliding window over the whole model."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str) -> GPTConfig:
    c = llama_options(hf, source)
    window = hf.get("sliding_window")
    if window:  # within the window, full attention is the same
        c = dataclasses.replace(c, seq_len=min(c.seq_len, window))
    return c


# MistralConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 32_000,
    "hidden_size": 4096,
    "intermediate_size": 14_336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "sliding_window": 4096,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="mistral",
    display="Mistral",
    hf_arch="MistralForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="llama",
    chat_format="mistral",
    stops=("</s>",),
    gguf_permute=True,
)

"""Qwen2 / Qwen2.5 (and DeepSeek-R1-Distill-Qwen): Llama's layers with q/k/v biases."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str) -> GPTConfig:
    c = llama_options(hf, source, qkv_bias=True, out_bias=False)
    window = hf.get("sliding_window")
    if window and hf.get("use_sliding_window"):  # within the window, full attention is the same
        c = dataclasses.replace(c, seq_len=min(c.seq_len, window))
    return c


# Qwen2Config's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 151_936,
    "hidden_size": 4096,
    "intermediate_size": 22_016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="qwen2",
    display="Qwen2",
    hf_arch="Qwen2ForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="qwen2",
    chat_format="chatml",
    stops=("<|im_end|>",),
)

"""Qwen3: Llama's layers with RMSNorm over each head of q and k."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families import llama
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str) -> GPTConfig:
    c = llama_options(hf, source, qk_norm=True)
    window = hf.get("sliding_window")
    if window and hf.get("use_sliding_window"):  # within the window, full attention is the same
        c = dataclasses.replace(c, seq_len=min(c.seq_len, window))
    return c


def hf_config(c: GPTConfig) -> dict:
    """config.json of a model TrainDeck created with arch llama and q/k norms."""
    config = {**llama.hf_config(c), "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    del config["mlp_bias"]  # full attention in every layer
    return {
        **config,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": c.n_layers,
    }


# Qwen3Config's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 151_936,
    "hidden_size": 4096,
    "intermediate_size": 22_016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="qwen3",
    display="Qwen3",
    hf_arch="Qwen3ForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="qwen3",
    chat_format="chatml",
    stops=("<|im_end|>",),
)

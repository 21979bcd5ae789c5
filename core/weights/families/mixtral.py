"""Mixtral (8x7B, 8x22B): Mistral's layers with a mixture of experts in every layer; the
top-k weights are always normalized. Released checkpoints keep each expert apart
(block_sparse_moe.experts.{e}.w1/w3/w2: gate, up, down)."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families.base import (
    Family,
    expert_rows,
    fused_expert_rows,
    gguf_experts,
    llama_options,
    llama_table,
    moe_options,
)


def config(hf: dict, source: str) -> GPTConfig:
    n = hf.get("num_local_experts", hf.get("num_experts", 8))
    every = list(range(hf["num_hidden_layers"]))
    moe = moe_options(hf, source, n, every, expert_dim=hf["intermediate_size"], norm_topk=True)
    c = llama_options(hf, source, moe=moe)
    window = hf.get("sliding_window")
    if window:  # within the window, full attention is the same
        c = dataclasses.replace(c, seq_len=min(c.seq_len, window))
    return c


def table(c: GPTConfig):
    rows = expert_rows(c, "model.layers.{i}.block_sparse_moe.", ("w1", "w3", "w2"), "gate")
    return llama_table(c) + rows


# MixtralConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 32_000,
    "hidden_size": 4096,
    "intermediate_size": 14_336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
}
# Other names MixtralConfig takes for these settings (its attribute_map)
ALIASES = {"num_experts": "num_local_experts"}


FAMILY = Family(
    defaults=DEFAULTS,
    aliases=ALIASES,
    name="mixtral",
    display="Mixtral",
    hf_arch="MixtralForCausalLM",
    config=config,
    table=table,
    fused_table=lambda c: llama_table(c) + fused_expert_rows(c),
    gguf_check=gguf_experts("llama", norm_topk=True),
    gguf_arch="llama",
    chat_format="mistral",
    stops=("</s>",),
    gguf_permute=True,
)

"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q/k norms) with a
mixture of experts in the layers decoder_sparse_step picks and mlp_only_layers leaves out;
norm_topk_prob says whether the top-k weights are normalized."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families import qwen3
from core.weights.families.base import (
    Family,
    expert_rows,
    fused_expert_rows,
    gguf_experts,
    llama_table,
    moe_options,
    stepped_sparse_layers,
)


def config(hf: dict, source: str) -> GPTConfig:
    n = hf.get("num_experts", hf.get("num_local_experts", 0))
    sparse = stepped_sparse_layers(hf, n)
    moe = moe_options(hf, source, n, sparse, expert_dim=hf["moe_intermediate_size"])
    return dataclasses.replace(qwen3.config(hf, source), moe=moe if sparse else None)


def table(c: GPTConfig):
    names = ("gate_proj", "up_proj", "down_proj")
    return llama_table(c) + expert_rows(c, "model.layers.{i}.mlp.", names, "gate")


# Qwen3MoeConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 151_936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "num_experts": 128,
    "norm_topk_prob": False,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}
# Other names Qwen3MoeConfig takes for these settings (its attribute_map)
ALIASES = {"num_local_experts": "num_experts"}


FAMILY = Family(
    defaults=DEFAULTS,
    aliases=ALIASES,
    name="qwen3_moe",
    display="Qwen3-MoE",
    hf_arch="Qwen3MoeForCausalLM",
    config=config,
    table=table,
    fused_table=lambda c: llama_table(c) + fused_expert_rows(c),
    gguf_check=gguf_experts("qwen3moe", norm_topk=True),
    gguf_arch="qwen3moe",
    chat_format="chatml",
    stops=("<|im_end|>",),
)

"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with a
mixture of experts in the layers decoder_sparse_step picks and mlp_only_layers leaves out, and
beside the experts a shared expert whose output a sigmoid gate scales."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families import qwen2
from core.weights.families.base import (
    Family,
    expert_rows,
    fused_expert_rows,
    gguf_experts,
    llama_table,
    moe_options,
    sparse_layers,
    stepped_sparse_layers,
)


def config(hf: dict, source: str) -> GPTConfig:
    n = hf.get("num_experts", hf.get("num_local_experts", 0))
    sparse = stepped_sparse_layers(hf, n)
    moe = moe_options(
        hf,
        source,
        n,
        sparse,
        expert_dim=hf["moe_intermediate_size"],
        shared_expert_dim=hf.get("shared_expert_intermediate_size") or None,
    )
    c = qwen2.config(hf, source)
    return dataclasses.replace(
        c, qkv_bias=bool(hf.get("qkv_bias", True)), moe=moe if sparse else None
    )


def shared_rows(c: GPTConfig) -> list:
    rows = []
    if not (c.moe and c.moe.get("shared_expert_dim")):
        return rows
    for i in sparse_layers(c):
        m, b = f"model.layers.{i}.mlp.", f"blocks.{i}.mlp."
        rows += [
            (
                b + "shared.fc.weight",
                [m + "shared_expert.gate_proj.weight", m + "shared_expert.up_proj.weight"],
                False,
            ),
            (b + "shared.proj.weight", [m + "shared_expert.down_proj.weight"], False),
            (b + "shared_gate.weight", [m + "shared_expert_gate.weight"], False),
        ]
    return rows


def table(c: GPTConfig):
    names = ("gate_proj", "up_proj", "down_proj")
    experts = expert_rows(c, "model.layers.{i}.mlp.", names, "gate")
    return llama_table(c) + experts + shared_rows(c)


# Qwen2MoeConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 151_936,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4,
    "num_experts": 60,
    "norm_topk_prob": False,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "qkv_bias": True,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="qwen2_moe",
    display="Qwen2-MoE",
    hf_arch="Qwen2MoeForCausalLM",
    config=config,
    table=table,
    fused_table=lambda c: llama_table(c) + fused_expert_rows(c) + shared_rows(c),
    gguf_check=gguf_experts("qwen2moe", norm_topk=False, shared=True),
    gguf_arch="qwen2moe",
    chat_format="chatml",
    stops=("<|im_end|>",),
)

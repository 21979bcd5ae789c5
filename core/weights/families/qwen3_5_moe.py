"""Qwen3.5-MoE: Qwen3.5's hybrid layers (qwen3_5.py) with a mixture of experts in every
layer, beside it a shared expert whose output a sigmoid gate scales; the top-k weights are
always normalized. Its text model's config.json is model_type qwen3_5_moe_text."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families import qwen3_5
from core.weights.families.base import (
    Family,
    expert_rows,
    fused_expert_rows,
    gguf_experts,
    moe_options,
)
from core.weights.families.qwen2_moe import shared_rows

GGUF_EXPERTS = gguf_experts("qwen35moe", norm_topk=True, shared=True)


def config(hf: dict, source: str) -> GPTConfig:
    text = qwen3_5.text_config(hf)
    n = text.get("num_experts", 0)
    moe = moe_options(
        {**text, "norm_topk_prob": True},
        source,
        n,
        list(range(text["num_hidden_layers"])),
        expert_dim=text["moe_intermediate_size"],
        shared_expert_dim=text.get("shared_expert_intermediate_size") or None,
    )
    if n:  # experts in every layer: no dense MLP, and no intermediate_size in its config
        text = {"intermediate_size": text["moe_intermediate_size"], **text}
    return dataclasses.replace(qwen3_5.config(text, source), moe=moe if n else None)


def table(c: GPTConfig):
    names = ("gate_proj", "up_proj", "down_proj")
    experts = expert_rows(c, "model.layers.{i}.mlp.", names, "gate")
    return qwen3_5.table(c) + experts + shared_rows(c)


# Qwen3_5MoeTextConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 248_320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 8,
    "num_experts": 256,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "rope_parameters": {
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "rope_type": "default",
    },
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="qwen3_5_moe",
    display="Qwen3.5-MoE",
    model_types=("qwen3_5_moe_text",),
    hf_arch="Qwen3_5MoeForCausalLM",
    config=config,
    table=table,
    fused_table=lambda c: qwen3_5.table(c) + fused_expert_rows(c) + shared_rows(c),
    gguf_arch="qwen35moe",
    gguf_check=lambda c: GGUF_EXPERTS(c) or qwen3_5.gguf_check(c),
    gguf_hparams=qwen3_5.gguf_hparams,
    gguf_tensor=qwen3_5.gguf_tensor,
    gguf_adapter=qwen3_5.gguf_adapter,
    gguf_rename=qwen3_5.gguf_rename,
    chat_format="qwen3_5",
    stops=("<|im_end|>",),
    # Qwen3.5's vision tower and merger, in its own composite class
    projector=dataclasses.replace(
        qwen3_5.PROJECTOR, classes=("Qwen3_5MoeForConditionalGeneration",)
    ),
)

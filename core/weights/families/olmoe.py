"""OLMoE (OLMoE-1B-7B): Llama-style layers whose q and k are RMS-normed over the whole
projection (not per head), q, k and v optionally clamped (clip_qkv), and a mixture of experts
in every layer; norm_topk_prob says whether the top-k weights are normalized.

Its instruct model's chat template is Tulu's (<|user|>, <|assistant|>, <|endoftext|>), which
is none of the formats TrainDeck writes for Ollama: the family names "plain", and an Ollama
export of a model carrying that template says so in one line (core.use.ollama.template)."""

from __future__ import annotations

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
    n = hf.get("num_experts", hf.get("num_local_experts", 64))
    every = list(range(hf["num_hidden_layers"]))
    moe = moe_options(hf, source, n, every, expert_dim=hf["intermediate_size"])
    clip = hf.get("clip_qkv")
    return llama_options(
        hf,
        source,
        qk_norm=True,
        qk_norm_whole=True,
        qkv_clip=float(clip) if clip is not None else None,
        moe=moe,
    )


def table(c: GPTConfig):
    names = ("gate_proj", "up_proj", "down_proj")
    return llama_table(c) + expert_rows(c, "model.layers.{i}.mlp.", names, "gate")


def gguf_check(c: GPTConfig) -> str | None:
    if c.n_kv_heads != c.n_heads:  # its k norm spans n_embd
        return "llama.cpp's olmoe has no grouped-query attention (num_key_value_heads)"
    if c.qkv_clip is not None:
        return "llama.cpp's olmoe does not clamp q, k and v (clip_qkv)"
    return gguf_experts("olmoe", norm_topk=False)(c)


# OlmoeConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 50_304,
    "hidden_size": 2048,
    "intermediate_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_experts_per_tok": 8,
    "num_experts": 64,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.01,
    "norm_topk_prob": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}
# Other names OlmoeConfig takes for these settings (its attribute_map)
ALIASES = {"num_local_experts": "num_experts"}


FAMILY = Family(
    defaults=DEFAULTS,
    aliases=ALIASES,
    name="olmoe",
    display="OLMoE",
    hf_arch="OlmoeForCausalLM",
    config=config,
    table=table,
    fused_table=lambda c: llama_table(c) + fused_expert_rows(c),
    gguf_check=gguf_check,
    gguf_arch="olmoe",
    chat_format="plain",
    stops=("<|endoftext|>",),
)

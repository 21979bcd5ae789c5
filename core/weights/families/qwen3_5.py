"""Qwen3.5 (dense): hybrid layers, three Gated DeltaNet linear-attention layers
(core.models.deltanet) before each full-attention layer (layer_types). The attention layers
gate their output with a sigmoid (q_proj twice as wide), norm q and k per head and turn a
quarter of each head (partial rotary); every RMSNorm scales by 1 + w. Its text model's
config.json is model_type qwen3_5_text (Qwen3_5ForCausalLM)."""

from __future__ import annotations

from core.models.model import LINEAR, GPTConfig, is_linear, layer_types_problem
from core.weights.families.base import (
    Family,
    UnsupportedModel,
    llama_options,
    llama_table,
    partial_rotary,
)


def text_config(hf: dict) -> dict:
    """The language model's fields (a multimodal config keeps them in text_config)."""
    return {**hf, **hf["text_config"]} if hf.get("text_config") else hf


def layer_types(hf: dict) -> list[str]:
    """config.json's layer_types, or every full_attention_interval-th layer full attention
    and the others linear, as transformers fills them in."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    every = hf.get("full_attention_interval", 4)
    n = hf["num_hidden_layers"]
    return [LINEAR if (i + 1) % every else "full_attention" for i in range(n)]


def config(hf: dict, source: str) -> GPTConfig:
    hf = text_config(hf)
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    c = llama_options(
        {"partial_rotary_factor": 0.25, **hf},
        source,
        qk_norm=True,
        norm_offset=1.0,
        attn_output_gate=True,
        rope_dim=partial_rotary({"partial_rotary_factor": 0.25, **hf}, head_dim),
        layer_types=layer_types(hf),
        linear_attn={
            "n_k_heads": hf.get("linear_num_key_heads", 16),
            "n_v_heads": hf.get("linear_num_value_heads", 32),
            "k_head_dim": hf.get("linear_key_head_dim", 128),
            "v_head_dim": hf.get("linear_value_head_dim", 128),
            "conv_kernel": hf.get("linear_conv_kernel_dim", 4),
        },
    )
    problem = layer_types_problem(c)
    if problem is not None:
        raise UnsupportedModel(f"{source}: {problem}")
    return c


def deltanet_rows(c: GPTConfig) -> list:
    rows = []
    for i in range(c.n_layers):
        if not is_linear(c, i):
            continue
        m, b = f"model.layers.{i}.linear_attn.", f"blocks.{i}.attn."
        projections = [m + f"in_proj_{x}.weight" for x in ("qkv", "z", "b", "a")]
        rows += [
            (b + "qkv.weight", projections, False),
            (b + "conv", [m + "conv1d.weight"], False),
            (b + "dt_bias", [m + "dt_bias"], False),
            (b + "A_log", [m + "A_log"], False),
            (b + "norm.weight", [m + "norm.weight"], False),
            (b + "proj.weight", [m + "out_proj.weight"], False),
        ]
    return rows


def table(c: GPTConfig) -> list:
    """Llama's rows, the linear layers' attention rows replaced by their DeltaNet's."""
    linear = tuple(f"blocks.{i}.attn." for i in range(c.n_layers) if is_linear(c, i))
    rows = [r for r in llama_table(c) if not (linear and r[0].startswith(linear))]
    return rows + deltanet_rows(c)


def gguf_check(c: GPTConfig) -> str | None:
    return "the GGUF export does not write Qwen3.5's linear-attention layers yet (qwen35)"


FAMILY = Family(
    name="qwen3_5",
    display="Qwen3.5",
    model_types=("qwen3_5_text",),
    hf_arch="Qwen3_5ForCausalLM",
    config=config,
    table=table,
    gguf_arch="qwen35",
    gguf_check=gguf_check,
    chat_format="qwen3_5",
    stops=("<|im_end|>",),
)

"""Qwen3-VL (dense): Qwen3's language model (RMSNorm over each head of q and k) inside
Qwen3VLForConditionalGeneration, with interleaved M-RoPE (text turns by one position on all
three axes, which is plain RoPE; images' 3-D positions: core.models.vision_qwen) and DeepStack.
Its text model's config.json is model_type qwen3_vl_text; it has no CausalLM class of its
own, so the hf export writes the composite."""

from __future__ import annotations

from core.weights.families import qwen3_5
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str):
    return llama_options(hf, source, qk_norm=True)


def gguf_composite(writer, c, hf: dict) -> None:
    """convert_hf_to_gguf.py's Qwen3VLTextModel keys: the M-RoPE sections of text_config's
    rope parameters (padded to four; text has one position on every axis, so where a config
    lacks them the pairs' cover is written) and the count of DeepStack layers, which
    llama.cpp's qwen3vl needs to split the projector's wide rows."""
    text = hf.get("text_config", {})
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    sections = list(rope.get("mrope_section") or [])
    if not sections:
        sections = qwen3_5.mrope_sections((c.rope_dim or c.head_dim) // 2)
    writer.add_rope_dimension_sections((sections + [0, 0, 0, 0])[:4])
    deep = hf.get("vision_config", {}).get("deepstack_visual_indexes", [])
    writer.add_num_deepstack_layers(len(deep))


# Qwen3VLTextConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 151_936,
    "hidden_size": 4096,
    "intermediate_size": 22_016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 128_000,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "rope_parameters": {"rope_theta": 500_000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="qwen3_vl",
    display="Qwen3-VL",
    model_types=("qwen3_vl_text",),
    hf_arch="Qwen3VLForConditionalGeneration",
    config=config,
    table=llama_table,
    gguf_arch="qwen3vl",
    gguf_composite=gguf_composite,
    projector=qwen3_5.PROJECTOR,
    chat_format="chatml",
    stops=("<|im_end|>",),
)

"""Qwen3-VL (dense): Qwen3's language model (RMSNorm over each head of q and k) inside
Qwen3VLForConditionalGeneration, with interleaved M-RoPE (text turns by one position on all
three axes, which is plain RoPE; images' 3-D positions: core.models.vision_qwen) and DeepStack.
Its text model's config.json is model_type qwen3_vl_text; it has no CausalLM class of its
own, so the hf export writes the composite."""

from __future__ import annotations

from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str):
    return llama_options(hf, source, qk_norm=True)


def gguf_check(c) -> str | None:
    return (
        "llama.cpp's qwen3vl reads DeepStack's layers beside M-RoPE; TrainDeck does not write "
        "Qwen3-VL's GGUF yet: export hf and convert it with llama.cpp's convert_hf_to_gguf.py"
    )


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
    gguf_check=gguf_check,
    chat_format="chatml",
    stops=("<|im_end|>",),
)

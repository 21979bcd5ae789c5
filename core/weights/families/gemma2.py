"""Gemma 2: GeGLU, 1 + w RMSNorms before and after each sub-layer, embeddings scaled by
sqrt(width), soft-capped attention scores and logits, sliding-window attention on every
other layer, query_pre_attn_scalar for the attention scale and its own head_dim."""

from __future__ import annotations

from core.models.model import GPTConfig
from core.weights.families.base import (
    Family,
    UnsupportedModel,
    add_one_to_norms,
    check_window_pattern,
    layer_types,
    llama_table,
    rope,
)

# Gemma's chat template: <start_of_turn>user ... <end_of_turn>
STOPS = ("<end_of_turn>", "<eos>")


def gemma_options(hf: dict, source: str, every: int) -> dict:
    """What Gemma 2 and 3 share."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedModel(f"{source}: hidden_activation {act!r} is not supported")
    heads = hf["num_attention_heads"]
    width = hf["hidden_size"]
    attn_bias = bool(hf.get("attention_bias", False))
    return {
        "hidden_dim": width,
        "n_layers": hf["num_hidden_layers"],
        "n_heads": heads,
        "n_kv_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": hf.get("head_dim") or width // heads,
        "ffn_dim": hf["intermediate_size"],
        "seq_len": hf.get("max_position_embeddings", 8192),
        "vocab_size": hf["vocab_size"],
        "bias": False,
        "qkv_bias": attn_bias,
        "out_bias": attn_bias,
        "norm": "rmsnorm",
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "norm_offset": 1.0,
        "post_norms": True,
        "embed_scale": width**0.5,
        "positions": "rope",
        "mlp": "geglu",
        "attn_scale": float(hf.get("query_pre_attn_scalar") or 256) ** -0.5,
        "sliding_window": hf.get("sliding_window"),
        "layer_types": layer_types(hf, every) if hf.get("sliding_window") else None,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
    }


def config(hf: dict, source: str) -> GPTConfig:
    theta, scaling = rope(hf, source)
    return GPTConfig(
        **gemma_options(hf, source, every=2),
        rope_theta=theta,
        rope_scaling=scaling,
        attn_softcap=hf.get("attn_logit_softcapping"),
        logit_softcap=hf.get("final_logit_softcapping"),
    )


def table(c: GPTConfig):
    return llama_table(c, post_norms=True)


def llama_cpp_scale(c: GPTConfig, large: int) -> float:
    """The attention scale llama.cpp uses: 1/sqrt(width / heads) for the 27B model (told by
    its layer count), else 1/sqrt(head_dim)."""
    return (c.hidden_dim / c.n_heads if c.n_layers == large else c.head_dim) ** -0.5


def check_scale(c: GPTConfig, large: int, what: str) -> str | None:
    want = llama_cpp_scale(c, large)
    if abs(c.attn_scale - want) > 1e-9 * want:
        return (
            f"llama.cpp's {what} scales attention by {want:.6g} for this shape, this model "
            f"by {c.attn_scale:.6g} (query_pre_attn_scalar)"
        )
    return None


def gguf_check(c: GPTConfig) -> str | None:
    return check_scale(c, 46, "gemma2") or check_window_pattern(c, 2, "gemma2")


def gguf_hparams(writer, c: GPTConfig) -> None:
    if c.attn_softcap:
        writer.add_attn_logit_softcapping(c.attn_softcap)
    if c.logit_softcap:
        writer.add_final_logit_softcapping(c.logit_softcap)
    if c.sliding_window:
        writer.add_sliding_window(c.sliding_window)


# Gemma2Config's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 256_000,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="gemma2",
    display="Gemma 2",
    hf_arch="Gemma2ForCausalLM",
    config=config,
    table=table,
    gguf_arch="gemma2",
    chat_format="gemma",
    stops=STOPS,
    gguf_tensor=add_one_to_norms,
    gguf_hparams=gguf_hparams,
    gguf_check=gguf_check,
)

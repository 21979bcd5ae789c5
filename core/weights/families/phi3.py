"""Phi-3, Phi-3.5 and Phi-4-mini: Llama-style layers with q/k/v and gate/up stored fused
(as ours are), a sliding window where the config sets one (Phi-3-mini-4k: 2047), LongRoPE on
the 128k variants (short and long factors by length, an attention factor) and partial
rotary (Phi-4-mini: 0.75 of each head)."""

from __future__ import annotations

from core.models.model import GPTConfig, rope_attention_factor, rope_kind
from core.weights.families.base import Family, llama_options, partial_rotary

SLIDING = "sliding_attention"


def config(hf: dict, source: str) -> GPTConfig:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if scaling.get("type", scaling.get("rope_type")) in ("su", "yarn"):  # Phi-3's old names
        hf = {**hf, "rope_scaling": {**scaling, "rope_type": "longrope", "type": "longrope"}}
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    window = hf.get("sliding_window")
    return llama_options(
        hf,
        source,
        rope_dim=partial_rotary(hf, head_dim),
        sliding_window=window,
        layer_types=[SLIDING] * hf["num_hidden_layers"] if window else None,
    )


def table(c: GPTConfig):
    rows = [
        ("tok_emb.weight", ["model.embed_tokens.weight"], False),
        ("ln_f.weight", ["model.norm.weight"], False),
    ]
    for i in range(c.n_layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        rows += [
            (b + "ln1.weight", [p + "input_layernorm.weight"], False),
            (b + "ln2.weight", [p + "post_attention_layernorm.weight"], False),
            (b + "attn.qkv.weight", [p + "self_attn.qkv_proj.weight"], False),
            (b + "attn.proj.weight", [p + "self_attn.o_proj.weight"], False),
            (b + "mlp.fc.weight", [p + "mlp.gate_up_proj.weight"], False),
            (b + "mlp.proj.weight", [p + "mlp.down_proj.weight"], False),
        ]
    if not c.tie_embeddings:
        rows.append(("head.weight", ["lm_head.weight"], False))
    return rows


def gguf_hparams(writer, c: GPTConfig) -> None:
    if c.sliding_window:
        writer.add_sliding_window(c.sliding_window)
    if rope_kind(c) == "longrope":
        writer.add_rope_scaling_orig_ctx_len(c.rope_scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_attn_factors(rope_attention_factor(c))


def gguf_extra(c: GPTConfig) -> dict:
    """LongRoPE's factors as llama.cpp reads them (rope_factors_long / _short)."""
    import gguf
    import torch

    if rope_kind(c) != "longrope":
        return {}
    t, names = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES
    return {
        names[t.ROPE_FACTORS_LONG] + ".weight": torch.tensor(c.rope_scaling["long_factor"]),
        names[t.ROPE_FACTORS_SHORT] + ".weight": torch.tensor(c.rope_scaling["short_factor"]),
    }


def gguf_notes(c: GPTConfig) -> list[str]:
    """What llama.cpp does otherwise than transformers (and TrainDeck) with a Phi-3."""
    notes = []
    if c.sliding_window and c.sliding_window < c.seq_len:  # llama.cpp turned Phi-3's SWA off
        notes.append(
            f"llama.cpp runs phi3 without its sliding window ({c.sliding_window} tokens): "
            f"text over {c.sliding_window} tokens is computed otherwise than in transformers"
        )
    if rope_kind(c) == "longrope":
        old = c.rope_scaling["original_max_position_embeddings"]
        notes.append(
            f"LongRoPE: llama.cpp takes the long factors for every position when its context "
            f"(n_ctx) is over {old} tokens, the short ones otherwise; transformers and "
            f"TrainDeck take them by the sequence's own length (over {old} tokens)"
        )
    return notes


# Phi3Config's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 32_064,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
        "rope_type": "default",
    },
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="phi3",
    display="Phi-3",
    hf_arch="Phi3ForCausalLM",
    config=config,
    table=table,
    gguf_arch="phi3",
    chat_format="phi",
    stops=("<|end|>", "<|endoftext|>"),
    gguf_hparams=gguf_hparams,
    gguf_extra=gguf_extra,
    gguf_notes=gguf_notes,
)

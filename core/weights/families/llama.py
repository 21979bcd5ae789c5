"""Llama 2/3/3.1/3.2 (and SmolLM/SmolLM2, TinyLlama, DeepSeek-R1-Distill-Llama): RMSNorm,
RoPE (llama3 or linear scaling), SwiGLU, grouped-query attention."""

from __future__ import annotations

from core.models.model import GPTConfig
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str) -> GPTConfig:
    return llama_options(hf, source)


def hf_config(c: GPTConfig) -> dict:
    """config.json of a Llama-style model TrainDeck created (arch llama, no q/k norms)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_dim,
        "intermediate_size": c.ffn_dim,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.seq_len,
        "rms_norm_eps": c.norm_eps,
        # rope_theta for transformers 4 and converters; rope_parameters for transformers 5
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": c.qkv_bias,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": c.tie_embeddings,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "torch_dtype": "float32",
        "mlp_bias": c.mlp_bias,
    }


# LlamaConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 32_000,
    "hidden_size": 4096,
    "intermediate_size": 11_008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="llama",
    display="Llama",
    hf_arch="LlamaForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="llama",
    chat_format="llama3",
    stops=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    gguf_permute=True,
)

"""SmolLM3: Llama's layers, with rotary positions left out of the layers its config's
no_rope_layers marks 0 (every 4th by default)."""

from __future__ import annotations

from core.models.model import GPTConfig
from core.weights.families.base import Family, llama_options, llama_table

EVERY = 4  # llama.cpp's smollm3 assumes a layer without RoPE every 4th


def config(hf: dict, source: str) -> GPTConfig:
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        every = hf.get("no_rope_layer_interval", EVERY)
        flags = [int((i + 1) % every != 0) for i in range(n)]
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    types = hf.get("layer_types") if window else None
    return llama_options(
        hf,
        source,
        nope_layers=[i for i, rope in enumerate(flags) if not rope],
        sliding_window=window if types else None,
        layer_types=types or None,
    )


def gguf_check(c: GPTConfig) -> str | None:
    expected = [i for i in range(c.n_layers) if (i + 1) % EVERY == 0]
    if list(c.nope_layers or ()) != expected:
        return (
            f"llama.cpp's smollm3 leaves RoPE out of every {EVERY}th layer ({expected}); "
            f"this model's no_rope_layers leave it out of {list(c.nope_layers or ())}"
        )
    if c.sliding_window:
        return "llama.cpp's smollm3 has no sliding window, which this model's config sets"
    return None


# SmolLM3Config's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 128_256,
    "hidden_size": 2048,
    "intermediate_size": 11_008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "use_sliding_window": False,
    "no_rope_layer_interval": 4,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 2000000.0, "rope_type": "default"},
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="smollm3",
    display="SmolLM3",
    hf_arch="SmolLM3ForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="smollm3",
    chat_format="chatml",
    stops=("<|im_end|>",),
    gguf_permute=True,
    gguf_check=gguf_check,
)

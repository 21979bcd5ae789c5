"""GPT-2 (and TrainDeck's own GPT-2-style model): LayerNorm, learned positions, GELU,
Conv1D weights (transposed), one fused q/k/v with biases."""

from __future__ import annotations

from core.models.model import GPTConfig
from core.weights.families.base import Family, Row, UnsupportedModel


def config(hf: dict, source: str) -> GPTConfig:
    act = hf.get("activation_function", "gelu_new")
    mlp = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}.get(act)
    if mlp is None:
        raise UnsupportedModel(f"{source}: activation_function {act!r} is not supported")
    for option in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(option):
            raise UnsupportedModel(f"{source}: {option} is not supported")
    return GPTConfig(
        hidden_dim=hf["n_embd"],
        n_layers=hf["n_layer"],
        n_heads=hf["n_head"],
        seq_len=hf.get("n_positions", 1024),
        vocab_size=hf["vocab_size"],
        ffn_dim=hf.get("n_inner") or 4 * hf["n_embd"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        mlp=mlp,
        tie_embeddings=hf.get("tie_word_embeddings", True),
    )


def table(c: GPTConfig) -> list[Row]:
    rows = [
        ("tok_emb.weight", ["transformer.wte.weight"], False),
        ("pos_emb.weight", ["transformer.wpe.weight"], False),
        ("ln_f.weight", ["transformer.ln_f.weight"], False),
        ("ln_f.bias", ["transformer.ln_f.bias"], False),
    ]
    pairs = [
        ("ln1", "ln_1", False),
        ("attn.qkv", "attn.c_attn", True),
        ("attn.proj", "attn.c_proj", True),
        ("ln2", "ln_2", False),
        ("mlp.fc", "mlp.c_fc", True),
        ("mlp.proj", "mlp.c_proj", True),
    ]
    for i in range(c.n_layers):
        for ours, hf, conv in pairs:
            rows.append((f"blocks.{i}.{ours}.weight", [f"transformer.h.{i}.{hf}.weight"], conv))
            rows.append((f"blocks.{i}.{ours}.bias", [f"transformer.h.{i}.{hf}.bias"], False))
    if not c.tie_embeddings:
        rows.append(("head.weight", ["lm_head.weight"], False))
    return rows


def normalise(name: str) -> str:
    """GPT-2 files saved by the original release have no 'transformer.' prefix."""
    return name if name.startswith(("transformer.", "lm_head.")) else "transformer." + name


def gguf_names(c: GPTConfig) -> dict[str, str]:
    """llama.cpp's GPT-2 tensor name -> ours."""
    import gguf

    t, name = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES
    out = {
        name[t.TOKEN_EMBD] + ".weight": "tok_emb.weight",
        name[t.POS_EMBD] + ".weight": "pos_emb.weight",
        name[t.OUTPUT_NORM] + ".weight": "ln_f.weight",
        name[t.OUTPUT_NORM] + ".bias": "ln_f.bias",
        name[t.OUTPUT] + ".weight": "head.weight",
    }
    parts = [
        (t.ATTN_NORM, "ln1"),
        (t.ATTN_QKV, "attn.qkv"),
        (t.ATTN_OUT, "attn.proj"),
        (t.FFN_NORM, "ln2"),
        (t.FFN_UP, "mlp.fc"),
        (t.FFN_DOWN, "mlp.proj"),
    ]
    for i in range(c.n_layers):
        for kind, ours in parts:
            base = name[kind].format(bid=i)
            out[base + ".weight"] = f"blocks.{i}.{ours}.weight"
            out[base + ".bias"] = f"blocks.{i}.{ours}.bias"
    return out


def hf_config(c: GPTConfig) -> dict:
    """config.json of a GPT-2-style model TrainDeck created: no special tokens."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.seq_len,
        "n_ctx": c.seq_len,
        "n_embd": c.hidden_dim,
        "n_layer": c.n_layers,
        "n_head": c.n_heads,
        "n_inner": c.ffn_dim,
        # exact erf GELU, as torch.nn.functional.gelu; or its tanh approximation
        "activation_function": "gelu_new" if c.mlp == "gelu_tanh" else "gelu",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": c.norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": c.tie_embeddings,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }


# GPT2Config's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 50_257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-05,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "tie_word_embeddings": True,
}
# Other names GPT2Config takes for these settings (its attribute_map)
ALIASES = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}


FAMILY = Family(
    defaults=DEFAULTS,
    aliases=ALIASES,
    name="gpt2",
    display="GPT-2",
    hf_arch="GPT2LMHeadModel",
    config=config,
    table=table,
    gguf_arch="gpt2",
    new_arch="gpt2",
    chat_format="plain",
    stops=("<|endoftext|>",),
    normalise=normalise,
    export_zero_biases=True,
    gguf_names=gguf_names,
)

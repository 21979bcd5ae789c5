"""Model families: how a Hugging Face config.json maps to core.models.model's options, and one
weight-name table per family, read one way to import and the other way to export.

A table row is (our name, [Hugging Face names], transposed). Several Hugging Face names are
concatenated along the first dimension into one of ours (q, k and v into qkv; gate and up into
the SwiGLU fc) and split back on export; transposed marks GPT-2's Conv1D layout.
"""

from __future__ import annotations

import torch

from core.errors import UserError
from core.models.model import GPTConfig

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED = ("gpt2", *LLAMA_LIKE)
# llama.cpp's architecture for each family's GGUF file.
GGUF_ARCH = {
    "gpt2": "gpt2",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
}
HF_ARCH = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModel(UserError):
    pass


# -- config.json -> GPTConfig ------------------------------------------------------------


def family_of(hf: dict, source: str = "config.json") -> str:
    if hf.get("auto_map"):
        raise UnsupportedModel(
            f"{source}: this model needs its own remote code (auto_map); TrainDeck never runs "
            "code from a model folder. Supported model_type values: " + ", ".join(SUPPORTED)
        )
    family = hf.get("model_type")
    if family not in SUPPORTED:
        raise UnsupportedModel(
            f"{source}: model_type {family!r} is not supported; supported: {', '.join(SUPPORTED)}"
        )
    return family


def _rope(hf: dict, source: str) -> tuple[float, dict | None]:
    params = hf.get("rope_parameters") or {}  # transformers 5 keeps theta and scaling here
    theta = float(hf.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = hf.get("rope_scaling") or params or None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise UnsupportedModel(
                f"{source}: rope scaling {kind!r} is not supported; supported: "
                + ", ".join(ROPE_TYPES)
            )
        if kind == "default":
            scaling = None
    return theta, scaling


def _gpt2_config(hf: dict, source: str) -> GPTConfig:
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


def _llama_config(hf: dict, family: str, source: str) -> GPTConfig:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModel(f"{source}: hidden_act {act!r} is not supported (only silu)")
    theta, scaling = _rope(hf, source)
    heads = hf["num_attention_heads"]
    context = hf.get("max_position_embeddings", 2048)
    window = hf.get("sliding_window")
    if window and (family == "mistral" or hf.get("use_sliding_window")):
        context = min(context, window)  # within the window, full attention is the same
    attn_bias = bool(hf.get("attention_bias", False))
    return GPTConfig(
        hidden_dim=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        ffn_dim=hf["intermediate_size"],
        seq_len=context,
        vocab_size=hf["vocab_size"],
        bias=False,
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        positions="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        mlp="swiglu",
        qkv_bias=True if family == "qwen2" else attn_bias,
        out_bias=False if family == "qwen2" else attn_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def model_config(hf: dict, source: str = "config.json") -> tuple[str, GPTConfig]:
    """(family, shape) of a Hugging Face config.json mapping."""
    family = family_of(hf, source)
    try:
        if family == "gpt2":
            return family, _gpt2_config(hf, source)
        return family, _llama_config(hf, family, source)
    except KeyError as e:
        raise UnsupportedModel(f"{source}: required field {e} is missing") from None


# -- weight-name tables ---------------------------------------------------------------------


def _gpt2_table(c: GPTConfig) -> list[tuple[str, list[str], bool]]:
    rows = [
        ("tok_emb.weight", ["transformer.wte.weight"], False),
        ("pos_emb.weight", ["transformer.wpe.weight"], False),
        ("ln_f.weight", ["transformer.ln_f.weight"], False),
        ("ln_f.bias", ["transformer.ln_f.bias"], False),
    ]
    pairs = [
        ("ln1", "ln_1", False), ("attn.qkv", "attn.c_attn", True),
        ("attn.proj", "attn.c_proj", True), ("ln2", "ln_2", False),
        ("mlp.fc", "mlp.c_fc", True), ("mlp.proj", "mlp.c_proj", True),
    ]  # fmt: skip
    for i in range(c.n_layers):
        for ours, hf, conv in pairs:
            rows.append((f"blocks.{i}.{ours}.weight", [f"transformer.h.{i}.{hf}.weight"], conv))
            rows.append((f"blocks.{i}.{ours}.bias", [f"transformer.h.{i}.{hf}.bias"], False))
    if not c.tie_embeddings:
        rows.append(("head.weight", ["lm_head.weight"], False))
    return rows


def _llama_table(c: GPTConfig) -> list[tuple[str, list[str], bool]]:
    rows = [
        ("tok_emb.weight", ["model.embed_tokens.weight"], False),
        ("ln_f.weight", ["model.norm.weight"], False),
    ]
    for i in range(c.n_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        b = f"blocks.{i}."
        rows += [
            (b + "ln1.weight", [p + "input_layernorm.weight"], False),
            (b + "ln2.weight", [p + "post_attention_layernorm.weight"], False),
            (b + "attn.q_norm.weight", [a + "q_norm.weight"], False),
            (b + "attn.k_norm.weight", [a + "k_norm.weight"], False),
            (b + "mlp.proj.weight", [m + "down_proj.weight"], False),
            (b + "mlp.proj.bias", [m + "down_proj.bias"], False),
            (b + "attn.proj.weight", [a + "o_proj.weight"], False),
            (b + "attn.proj.bias", [a + "o_proj.bias"], False),
        ]
        for kind in ("weight", "bias"):
            qkv = [a + f"{x}_proj.{kind}" for x in "qkv"]
            rows.append((b + f"attn.qkv.{kind}", qkv, False))
            rows.append(
                (b + f"mlp.fc.{kind}", [m + f"gate_proj.{kind}", m + f"up_proj.{kind}"], False)
            )
    if not c.tie_embeddings:
        rows.append(("head.weight", ["lm_head.weight"], False))
    return rows


def table(family: str, c: GPTConfig) -> list[tuple[str, list[str], bool]]:
    return _gpt2_table(c) if family == "gpt2" else _llama_table(c)


def split_rows(name: str, c: GPTConfig, tensor: torch.Tensor, n_parts: int) -> list:
    """One of our tensors cut into the rows of its n_parts Hugging Face tensors (q, k, v or
    SwiGLU's gate, up); a LoRA B splits the same way."""
    if n_parts == 1:
        return [tensor]
    if ".attn.qkv." in name:
        sizes = [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim]
    else:
        sizes = [c.ffn_dim] * n_parts
    return list(tensor.split(sizes, dim=0))


def normalise_hf(names: list[str], family: str) -> dict[str, str]:
    """Map every name a checkpoint may use to the table's: GPT-2 files saved by the original
    release have no 'transformer.' prefix."""
    out = {}
    for n in names:
        key = n
        if family == "gpt2" and not n.startswith(("transformer.", "lm_head.")):
            key = "transformer." + n
        out[key] = n
    return out


def _join(parts: list, transposed: bool) -> torch.Tensor:
    if transposed:
        parts = [p.t() for p in parts]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def _joiner(parts: list, transposed: bool):
    """A file tensor itself when nothing has to be joined or turned; else a function that
    joins the parts when called (a memory-mapped model is not joined all at once)."""
    if len(parts) == 1 and not transposed:
        return parts[0]
    return lambda: _join(parts, transposed)


def import_weights(family: str, c: GPTConfig, hf_state: dict, wanted: set[str],
                   lazy: bool = False) -> dict:  # fmt: skip
    """Our state dict (names in wanted) from a Hugging Face one; raises naming what is missing.
    lazy: a weight that must be joined (fused q/k/v, gate/up) or transposed comes as a
    function that makes it."""
    names = normalise_hf(list(hf_state), family)
    out = {}
    for ours, hf_names, transposed in table(family, c):
        if ours not in wanted:
            continue
        missing = [n for n in hf_names if n not in names]
        if missing:
            raise UnsupportedModel(f"weights: {missing[0]} is missing from the model files")
        parts = [hf_state[names[n]] for n in hf_names]
        out[ours] = _joiner(parts, transposed) if lazy else _join(parts, transposed)
    left = sorted(wanted - set(out) - ({"head.weight"} if c.tie_embeddings else set()))
    if left:
        raise UnsupportedModel(f"weights: nothing in the model files maps to {left[0]}")
    return out


def export_weights(family: str, c: GPTConfig, state: dict) -> dict:
    """A Hugging Face state dict from ours (fp32, contiguous)."""
    out = {}
    for ours, hf_names, transposed in table(family, c):
        if ours not in state:
            if family == "gpt2" and ours.endswith(".bias"):  # bias-free: zeros for GPT-2
                weight = state[ours[: -len("bias")] + "weight"]
                out[hf_names[0]] = torch.zeros(weight.shape[0])
            continue
        tensor = state[ours].detach().float().cpu()
        parts = split_rows(ours, c, tensor, len(hf_names))
        for name, part in zip(hf_names, parts, strict=True):
            out[name] = (part.t() if transposed else part).contiguous()
    return out


def new_model_family(c: GPTConfig) -> str:
    """The family a model TrainDeck created is, from its shape (GPTConfig.from_train makes
    two): Llama's options (RMSNorm, rotary positions, SwiGLU) are llama, or qwen3 (Llama with
    q/k norms); anything else is TrainDeck's GPT-2-style model."""
    if (c.norm, c.positions, c.mlp) == ("rmsnorm", "rope", "swiglu"):
        return "qwen3" if c.qk_norm else "llama"
    return "gpt2"


def new_model_hf_config(c: GPTConfig) -> dict:
    """config.json for a model TrainDeck created, in the family its shape is (new_model_family):
    no special tokens, as its tokenizer (bytes or TrainDeck's BPE) has none."""
    family = new_model_family(c)
    if family == "gpt2":
        return _gpt2_hf_config(c)
    config = {
        "architectures": [HF_ARCH[family]],
        "model_type": family,
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
    }
    if family == "llama":
        config["mlp_bias"] = c.mlp_bias
    else:  # Qwen3: full attention in every layer
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.n_layers)
    return config


def _gpt2_hf_config(c: GPTConfig) -> dict:
    return {
        "architectures": [HF_ARCH["gpt2"]],
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

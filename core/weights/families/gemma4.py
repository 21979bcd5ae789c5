"""Gemma 4 (gemma4_text, Gemma4ForCausalLM), dense and the 26B-A4B mixture of experts:
Gemma 3's layers (four plain-weight RMSNorms a layer, q/k norms, GeGLU, sqrt(width)-scaled
embeddings, five sliding layers to one full) with attention scaled by 1.0, a scale-free norm
on the values and a scalar on each layer's output, plus the options of core.models.per_layer:
per-layer input embeddings (E2B/E4B), full-attention layers with their own head size, kv heads
and "proportional" partial RoPE, keys and values shared by the last layers, k_eq_v, and the
MoE block (core.models.moe's rms_softmax_topk router beside a dense MLP)."""

from __future__ import annotations

import torch

from core.models.model import GPTConfig
from core.models.per_layer import PerLayer, kv_source, table_params
from core.weights.families.base import (
    PROJECTOR_SUFFIXES,
    Family,
    Projector,
    Row,
    UnsupportedModel,
    layer_types,
    sparse_layers,
)

STOPS = ("<turn|>", "<eos>")  # Gemma 4's chat template: <|turn>user ... <turn|>
LAYER_KEYS = ("head_dim", "num_key_value_heads")  # what per_layer_config may set
SHARED_FROM = ["sliding_attention", "full_attention"]  # llama.cpp's last two unshared layers


def full_layer_shape(hf: dict, types: list[str], source: str) -> tuple[int, int | None]:
    """(head_dim, kv heads or None) of the full-attention layers: per_layer_config's, or
    global_head_dim and num_global_key_value_heads as transformers fills them in."""
    overrides = hf.get("per_layer_config")
    if overrides == {}:  # as transformers 5 saves one whose full layers have the plain shape
        return hf.get("head_dim") or 256, None
    if overrides is None:
        kv = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
        return int(hf.get("global_head_dim") or 512), kv
    full = {i for i, t in enumerate(types) if t == "full_attention"}
    shapes = set()
    for key, values in overrides.items():
        unknown = sorted(set(values) - set(LAYER_KEYS))
        if unknown or int(key) not in full:
            raise UnsupportedModel(
                f"{source}: per_layer_config sets {unknown or sorted(values)} on layer {key}; "
                f"supported: {', '.join(LAYER_KEYS)} on full-attention layers"
            )
        shapes.add((values.get("head_dim"), values.get("num_key_value_heads")))
    if len(shapes) > 1 or len(overrides) != len(full):
        raise UnsupportedModel(
            f"{source}: per_layer_config gives the full-attention layers different shapes; "
            "supported: one shape for all of them"
        )
    head, kv = shapes.pop() if shapes else (None, None)
    return head or hf.get("head_dim") or 256, kv


def rope_settings(hf: dict, source: str) -> dict:
    """GPTConfig's RoPE fields from rope_parameters (one set a layer type)."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or {}
    local = params.get("sliding_attention") or {}
    kind = full.get("rope_type", "default")
    if kind not in ("default", "proportional") or local.get("rope_type", "default") != "default":
        raise UnsupportedModel(
            f"{source}: rope_parameters {kind!r} on full-attention layers is not supported; "
            "supported: proportional or default (sliding layers: default)"
        )
    scaling = None
    if kind == "proportional":
        scaling = {
            "rope_type": "proportional",
            "partial_rotary_factor": float(full.get("partial_rotary_factor", 1.0)),
            "factor": float(full.get("factor", 1.0)),
        }
    return {
        "rope_theta": float(full.get("rope_theta") or 1_000_000.0),
        "rope_scaling": scaling,
        "rope_local_theta": float(local.get("rope_theta") or 10_000.0),
    }


def moe(hf: dict, source: str) -> dict | None:
    if not hf.get("enable_moe_block"):
        return None
    n, k = hf["num_experts"], hf["top_k_experts"]
    if not 1 <= k <= n:
        raise UnsupportedModel(
            f"{source}: top_k_experts ({k}) must be between 1 and num_experts ({n})"
        )
    return {
        "n_experts": n,
        "top_k": k,
        "expert_dim": hf["moe_intermediate_size"],
        "norm_topk": True,
        "router": "rms_softmax_topk",
        "activation": "gelu_tanh",
        "parallel_dense": True,
    }


def config(hf: dict, source: str) -> GPTConfig:
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedModel(f"{source}: hidden_activation {act!r} is not supported")
    if hf.get("use_bidirectional_attention") == "all":
        raise UnsupportedModel(
            f"{source}: use_bidirectional_attention 'all' is not supported (causal models only)"
        )
    n, shared = hf["num_hidden_layers"], hf.get("num_kv_shared_layers") or 0
    if not 0 <= shared < n:
        raise UnsupportedModel(
            f"{source}: num_kv_shared_layers must be 0 to {n - 1} (num_hidden_layers - 1), "
            f"got {shared}"
        )
    types = layer_types(hf, 6)
    unknown = sorted(set(types) - set(SHARED_FROM))
    if unknown or len(types) != n:
        raise UnsupportedModel(
            f"{source}: layer_types must be {n} of sliding_attention and full_attention, "
            f"got {len(types)}" + (f" with {', '.join(map(repr, unknown))}" if unknown else "")
        )
    types[-1] = "full_attention"  # as transformers forces it
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    full_head, full_kv = full_layer_shape(hf, types, source)
    bias = bool(hf.get("attention_bias", False))
    c = GPTConfig(
        hidden_dim=width,
        n_layers=n,
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or 256,
        ffn_dim=hf["intermediate_size"],
        seq_len=hf.get("max_position_embeddings", 131_072),
        vocab_size=hf["vocab_size"],
        bias=False,
        qkv_bias=bias,
        out_bias=bias,
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        post_norms=True,
        embed_scale=width**0.5,
        positions="rope",
        mlp="geglu",
        attn_scale=1.0,
        sliding_window=hf.get("sliding_window") or 512,
        layer_types=types,
        **rope_settings(hf, source),
        qk_norm=True,
        logit_softcap=hf.get("final_logit_softcapping"),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        moe=moe(hf, source),
        per_layer=PerLayer(
            input_dim=hf.get("hidden_size_per_layer_input") or None,
            input_vocab=hf.get("vocab_size_per_layer_input") or hf["vocab_size"],
            full_head_dim=full_head,
            full_kv_heads=full_kv,
            k_eq_v=bool(hf.get("attention_k_eq_v", False)),
            v_norm=True,
            kv_shared_layers=shared,
            wide_shared_mlp=bool(hf.get("use_double_wide_mlp", False)),
            layer_scalar=True,
        ),
    )
    try:
        [kv_source(c, i) for i in range(n)]
    except ValueError as e:
        raise UnsupportedModel(f"{source}: num_kv_shared_layers {shared}: {e}") from None
    return c


def table(c: GPTConfig) -> list[Row]:
    rows = [
        ("tok_emb.weight", ["model.embed_tokens.weight"], False),
        ("ln_f.weight", ["model.norm.weight"], False),
    ]
    if c.per_layer.input_dim:
        rows += [
            ("per_layer_inputs.table.weight", ["model.embed_tokens_per_layer.weight"], False),
            ("per_layer_inputs.proj.weight", ["model.per_layer_model_projection.weight"], False),
            ("per_layer_inputs.norm.weight", ["model.per_layer_projection_norm.weight"], False),
        ]
    moe_layers = set(sparse_layers(c))
    for i in range(c.n_layers):
        rows += layer_rows(c, i, i in moe_layers)
    if not c.tie_embeddings:
        rows.append(("head.weight", ["lm_head.weight"], False))
    return rows


def layer_rows(c: GPTConfig, i: int, sparse: bool) -> list[Row]:
    p, b = f"model.layers.{i}.", f"blocks.{i}."
    a = p + "self_attn."
    rows = [
        (b + "ln1.weight", [p + "input_layernorm.weight"], False),
        (b + "ln1_post.weight", [p + "post_attention_layernorm.weight"], False),
        (b + "ln2.weight", [p + "pre_feedforward_layernorm.weight"], False),
        (b + "ln2_post.weight", [p + "post_feedforward_layernorm.weight"], False),
        (b + "scalar", [p + "layer_scalar"], False),
        (b + "attn.q_norm.weight", [a + "q_norm.weight"], False),
        (b + "attn.proj.weight", [a + "o_proj.weight"], False),
        (b + "attn.proj.bias", [a + "o_proj.bias"], False),
    ]
    own_kv = kv_source(c, i) is None
    k_eq_v = c.per_layer.k_eq_v and not (c.layer_types and c.layer_types[i] == "sliding_attention")
    parts = "q" if not own_kv else ("qk" if k_eq_v else "qkv")
    for kind in ("weight", "bias"):
        rows.append((b + f"attn.qkv.{kind}", [a + f"{x}_proj.{kind}" for x in parts], False))
    if own_kv:
        rows.append((b + "attn.k_norm.weight", [a + "k_norm.weight"], False))
    m = b + ("mlp.dense." if sparse else "mlp.")
    rows += [
        (m + "fc.weight", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], False),
        (m + "proj.weight", [p + "mlp.down_proj.weight"], False),
    ]
    if c.per_layer.input_dim:
        rows += [
            (b + "per_layer.gate.weight", [p + "per_layer_input_gate.weight"], False),
            (b + "per_layer.up.weight", [p + "per_layer_projection.weight"], False),
            (b + "per_layer.norm.weight", [p + "post_per_layer_input_norm.weight"], False),
        ]
    if sparse:
        e = b + "mlp."
        rows += [
            (e + "router.weight", [p + "router.proj.weight"], False),
            (e + "router_scale", [p + "router.scale"], False),
            (e + "expert_scale", [p + "router.per_expert_scale"], False),
            (e + "gate_up", [p + "experts.gate_up_proj"], False),
            (e + "down", [p + "experts.down_proj"], False),
            (e + "dense_norm.weight", [p + "post_feedforward_layernorm_1.weight"], False),
            (e + "in_norm.weight", [p + "pre_feedforward_layernorm_2.weight"], False),
            (e + "out_norm.weight", [p + "post_feedforward_layernorm_2.weight"], False),
        ]
    return rows


# -- GGUF (llama.cpp's gemma4, as convert_hf_to_gguf.py's Gemma4Model writes it) -------------


def gguf_rename(hf_name: str) -> str | None:
    """The router's scales, which gguf's map lacks: ffn_gate_inp.scale, ffn_down_exps.scale."""
    parts = hf_name.split(".")
    if len(parts) == 5 and parts[3] == "router" and parts[4] in ("scale", "per_expert_scale"):
        tensor = "ffn_gate_inp" if parts[4] == "scale" else "ffn_down_exps"
        return f"blk.{parts[2]}.{tensor}.scale"
    return None


def gguf_hparams(writer, c: GPTConfig) -> None:
    """Per-layer shapes: sliding pattern, the full layers' head size, kv heads and rotary
    dimensions apart from the sliding layers', shared kv layers, per-layer input width."""
    sliding, p = [t == "sliding_attention" for t in c.layer_types], c.per_layer
    full_head = p.full_head_dim or c.head_dim
    writer.add_sliding_window(c.sliding_window)
    writer.add_sliding_window_pattern(sliding)
    writer.add_shared_kv_layers(p.kv_shared_layers)
    writer.add_embedding_length_per_layer_input(p.input_dim or 0)
    writer.add_key_length(full_head)
    writer.add_value_length(full_head)
    writer.add_key_length_swa(c.head_dim)
    writer.add_value_length_swa(c.head_dim)
    writer.add_rope_dimension_count(full_head)  # proportional: rope_freqs keeps the rest still
    writer.add_rope_dimension_count_swa(c.head_dim)
    writer.add_rope_freq_base_swa(c.rope_local_theta)
    if p.wide_shared_mlp:
        first = c.n_layers - p.kv_shared_layers
        writer.add_feed_forward_length(
            [c.ffn_dim * (2 if i >= first else 1) for i in range(c.n_layers)]
        )
    if p.full_kv_heads:
        writer.add_head_count_kv([c.n_kv_heads if s else p.full_kv_heads for s in sliding])
    if c.logit_softcap:
        writer.add_final_logit_softcapping(c.logit_softcap)


def gguf_extra(c: GPTConfig) -> dict:
    """rope_freqs for the full layers' proportional RoPE: 1 for the angles that turn, 1e30
    (no turn) for the rest, as llama.cpp's neox rotation has no gap between them."""
    import torch

    scaling = c.rope_scaling or {}
    if scaling.get("rope_type") != "proportional":
        return {}
    half = (c.per_layer.full_head_dim or c.head_dim) // 2
    turning = int(scaling["partial_rotary_factor"] * half)
    values = [1.0] * turning + [1e30] * (half - turning)
    return {"rope_freqs.weight": torch.tensor(values, dtype=torch.float32)}


def gguf_check(c: GPTConfig) -> str | None:
    if c.rope_local_theta != 10_000.0:
        return (
            "llama.cpp's gemma4 gives sliding layers RoPE base 10000, this model "
            f"{c.rope_local_theta:g}"
        )
    shared = c.per_layer.kv_shared_layers
    first = c.n_layers - shared
    if shared and c.layer_types[first - 2 : first] != SHARED_FROM:
        return (
            "llama.cpp's gemma4 takes shared keys and values from the two layers before the "
            "shared ones, a sliding then a full-attention layer; this model's layer_types differ"
        )
    if (c.rope_scaling or {}).get("factor", 1.0) != 1.0:
        return "llama.cpp's gemma4 has no factor on proportional RoPE, which this model sets"
    if not c.layer_types or c.layer_types[-1] != "full_attention":
        return "llama.cpp's gemma4 needs layer_types ending in a full-attention layer"
    return None


def form(c: GPTConfig) -> str:
    """The info line's words for this model's form."""
    parts = []
    if c.moe:
        parts.append(f"MoE: {c.moe['n_experts']} experts, top {c.moe['top_k']}")
    if c.per_layer.input_dim:
        table = table_params(c)
        size = f"{table / 1e9:.2f}B" if table >= 1e9 else f"{table / 1e6:.1f}M"
        parts.append(f"per-layer inputs: a {size}-parameter table, looked up, frozen under LoRA")
    if c.per_layer.kv_shared_layers:
        parts.append(f"{c.per_layer.kv_shared_layers} layers sharing keys and values")
    return ", ".join(parts)


def notes(hf: dict) -> list[str]:
    text = hf.get("text_config") or hf
    try:
        c = config(text, "config.json")
    except (UnsupportedModel, KeyError):
        return []
    described = form(c)
    return [f"Gemma 4 ({described})"] if described else []


# -- the projector file: its vision and audio towers (the converter's Gemma4VisionAudioModel) --


def projector_params(w, hf: dict, vision: dict, pre: dict) -> None:
    w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    audio = hf.get("audio_config")
    if audio:
        w.add_audio_num_mel_bins(audio.get("input_feat_size", 128))
        w.add_audio_attention_layernorm_eps(1e-5)


def is_audio(name: str) -> bool:
    return "audio_tower" in name or "embed_audio" in name


def projector_tensors(name: str, t: torch.Tensor, tmap, vision: dict):
    if t.dim() == 0:  # the clipped linears' scalar bounds
        t = t.unsqueeze(0)
    if is_audio(name):
        name = name.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
        if name.endswith(("per_dim_key_scale", "per_dim_scale")):
            name, t = name + ".weight", torch.nn.functional.softplus(t)
        if "lconv1d.depthwise_conv1d" in name and name.endswith(".weight"):
            t = t.reshape(t.shape[0], t.shape[2])
    else:
        name = name.replace("model.vision_tower.encoder.", "vision_model.model.")
        name = name.replace(".linear.weight", ".weight")
        if name.endswith(("layer_scalar", "position_embedding_table")):
            name += ".weight"
        if name.endswith("patch_embedder.input_proj.weight"):  # [n, p*p*3] -> [n, 3, p, p]
            n, flat = t.shape
            p = int((flat // 3) ** 0.5)
            t = t.reshape(n, p, p, 3).permute(0, 3, 1, 2).contiguous()
    yield tmap.get_name(name, try_suffixes=PROJECTOR_SUFFIXES), t


def projector_problem(vision: dict) -> str | None:
    k = vision.get("pooling_kernel_size", 3)
    return None if k == 3 else f"llama.cpp's gemma4v pools 3x3 patches, this tower {k}x{k}"


PROJECTOR = Projector(
    classes=("Gemma4ForConditionalGeneration",),
    vision="gemma4v",
    audio="gemma4a",
    params=projector_params,
    tensors=projector_tensors,
    f32=lambda name: (
        ("position_embedding_table" in name)
        or (is_audio(name) and (".conv" in name or "_conv" in name) and ".weight" in name)
    ),
    is_audio=is_audio,
    vision_config=lambda v: {**v, "image_size": 224},  # the converter's: llama.cpp ignores it
    problem=projector_problem,
)

# Gemma4TextConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 262_144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 512,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="gemma4",
    model_types=("gemma4_text",),
    display="Gemma 4",
    hf_arch="Gemma4ForCausalLM",
    config=config,
    table=table,
    fused_table=table,
    gguf_arch="gemma4",
    chat_format="gemma4",
    stops=STOPS,
    notes=notes,
    gguf_hparams=gguf_hparams,
    gguf_extra=gguf_extra,
    gguf_check=gguf_check,
    gguf_rename=gguf_rename,
    gguf_fused_gate_up=True,
    projector=PROJECTOR,
)

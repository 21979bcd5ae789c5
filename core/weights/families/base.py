"""What a family module gives (Family) and the pieces several families share: reading RoPE
settings from config.json, the Llama-style config mapping and weight-name table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.errors import UserError
from core.models.model import GPTConfig

Row = tuple[str, list[str], bool]  # (our name, [Hugging Face names], transposed)
# the endings gguf's tensor map tries on a projector's tensor names
PROJECTOR_SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


class UnsupportedModel(UserError):
    pass


@dataclass(frozen=True)
class Projector:
    """How llama.cpp's converter (convert_hf_to_gguf.py's MmprojModel subclasses) writes the
    towers of a family's composites into the projector file (core.use.mmproj): llama.cpp's
    projector types, the class's own metadata, its tensors under llama.cpp's names, those
    kept in f32."""

    classes: tuple[str, ...]  # the composite classes (architectures) it is written for
    vision: str  # clip projector type of the vision tower
    params: Callable  # (gguf writer, composite config.json, vision config, preprocessor) -> None
    tensors: Callable  # (name, tensor, tensor map, vision config) -> (gguf name, tensor)...
    f32: Callable[[str], bool] = lambda name: False  # forced f32 (the converter's force_quant)
    audio: str | None = None  # clip projector type of the audio tower, where llama.cpp has one
    is_audio: Callable[[str], bool] = lambda name: False  # a tensor of the audio tower
    vision_config: Callable[[dict], dict] = lambda v: v  # the converter's renamed fields
    # vision config -> what llama.cpp would run otherwise (a shape its graph fixes), or None
    problem: Callable[[dict], str | None] = lambda v: None


def gguf_tensor_name(kind, suffix: str, index: int | None = None) -> str:
    """gguf's name of a tensor kind (gguf.MODEL_TENSOR), of block index where it has one."""
    import gguf

    base = gguf.TENSOR_NAMES[kind]
    return (base.format(bid=index) if index is not None else base) + suffix


@dataclass(frozen=True)
class Family:
    """One model family as data and small hooks: a module per family makes one of these and
    the registry (core.weights.families) lists them. No other file compares family names."""

    name: str  # the registry's key: a config.json model_type it reads
    display: str  # for people: "Gemma 2"
    hf_arch: str  # the architecture an hf export writes
    config: Callable[[dict, str], GPTConfig]  # config.json -> the model's options
    table: Callable[[GPTConfig], list[Row]]  # weight names, read both ways
    gguf_arch: str  # llama.cpp's architecture name
    model_types: tuple[str, ...] = ()  # more config.json model_type values it reads
    new_arch: str = "llama"  # TrainConfig.arch a fine-tune of it shows (gpt2 or llama)
    chat_format: str = "chatml"  # its usual chat format: a name in core.use.ollama.formats
    stops: tuple[str, ...] = ()  # its chat template's end-of-turn tokens
    normalise: Callable[[str], str] | None = None  # a file's tensor name -> the table's
    export_zero_biases: bool = False  # GPT-2: a bias-free model exports zero biases
    gguf_names: Callable | None = None  # c -> {llama.cpp name: ours}, instead of gguf's map
    gguf_permute: bool = False  # llama.cpp's llama rotates interleaved pairs: q/k reordered
    gguf_tensor: Callable | None = None  # (llama.cpp name, fp32 tensor, c) -> what it reads
    # (a Hugging Face name's end, the end llama.cpp's converter gives it before gguf's map)
    gguf_adapter: Callable | None = None  # (llama.cpp name, A, B, c) -> (A, B) in its order
    gguf_hparams: Callable | None = None  # (gguf writer, c) -> its own metadata keys
    # (gguf writer, c, the composite's config.json) -> keys the converter reads from the
    # composite's other parts (Qwen3-VL's DeepStack count from its vision_config)
    gguf_composite: Callable | None = None
    gguf_check: Callable | None = None  # c -> why llama.cpp would run it otherwise, or None
    gguf_extra: Callable | None = None  # c -> {llama.cpp name: tensor} it adds (rope factors)
    gguf_notes: Callable | None = None  # c -> where llama.cpp runs it otherwise, and when
    export_config: Callable | None = None  # a fine-tune's base config.json -> the export's
    notes: Callable | None = None  # hf config.json -> lines to log when loading it
    # MoE: the table for transformers 5.x's in-memory layout (experts fused in 3-D tensors),
    # read where a file has those names; `table` gives the released per-expert layout
    fused_table: Callable[[GPTConfig], list[Row]] | None = None
    # MoE experts held in a layout of its own (gpt-oss): (our name, tensor, to_hf) -> the
    # tensor in the other layout, applied to stacked expert tensors after joining (import)
    # and before splitting (export)
    convert: Callable | None = None
    # llama.cpp's architecture reads gate and up experts as one ffn_gate_up_exps tensor
    gguf_fused_gate_up: bool = False
    # a Hugging Face name gguf's own map lacks -> llama.cpp's name, or None (Gemma 4's router)
    gguf_rename: Callable[[str], str | None] | None = None
    # its composites' towers in llama.cpp's projector file (mmproj), where the converter has one
    projector: Projector | None = None
    # config.json keys -> its transformers config class's defaults (rope_parameters: what
    # the class fills in when a file states no RoPE settings): a released config.json
    # leaves out what equals them (tests/core/test_released_configs.py keeps them equal)
    defaults: dict = field(default_factory=dict)
    # another name config.json may give a setting -> the name the family reads (the class's
    # attribute_map: GPT-2's hidden_size is its n_embd)
    aliases: dict[str, str] = field(default_factory=dict)


# A file's RoPE settings, the older form (rope_theta, rope_scaling) or transformers 5's
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta")


def with_defaults(hf: dict, defaults: dict, aliases: dict | None = None) -> dict:
    """config.json with what it leaves out taken from the family's defaults, as its
    transformers class fills it in; a setting given under another name (aliases) is read
    under the family's. RoPE settings go as one: a file that states its own keeps them,
    taking from the default only the base (rope_theta) and partial_rotary_factor it does not
    state."""
    renamed = {name: hf[alias] for alias, name in (aliases or {}).items() if alias in hf}
    hf = {**renamed, **hf}
    if not any(hf.get(key) is not None for key in ROPE_KEYS):
        return {**defaults, **hf}
    out = {**{k: v for k, v in defaults.items() if k != "rope_parameters"}, **hf}
    default = defaults.get("rope_parameters") or {}
    stated = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in default and hf.get(key) is None and key not in stated:
            out[key] = default[key]
    return out


def moe_options(hf: dict, source: str, n_experts: int, sparse: list[int], **extra) -> dict:
    """GPTConfig.moe from the config.json fields every MoE family shares; the aux loss joins
    training where the config asks transformers for it (output_router_logits)."""
    top_k = hf.get("num_experts_per_tok", 2)
    if not 1 <= top_k <= n_experts:
        raise UnsupportedModel(
            f"{source}: num_experts_per_tok ({top_k}) must be between 1 and the expert "
            f"count ({n_experts})"
        )
    coef = float(hf.get("router_aux_loss_coef") or 0.0)
    return {
        "n_experts": n_experts,
        "top_k": top_k,
        "norm_topk": bool(hf.get("norm_topk_prob", False)),
        "router": "softmax_topk",
        "sparse_layers": sparse,
        "aux_coef": coef if hf.get("output_router_logits") else 0.0,
        **extra,
    }


def stepped_sparse_layers(hf: dict, n_experts: int) -> list[int]:
    """The Qwen MoEs' sparse layers: every decoder_sparse_step-th layer, less those
    mlp_only_layers keeps dense (none without experts)."""
    step = hf.get("decoder_sparse_step", 1)
    dense = set(hf.get("mlp_only_layers") or ())
    layers = range(hf["num_hidden_layers"])
    return [i for i in layers if n_experts > 0 and i not in dense and (i + 1) % step == 0]


def expert_rows(c: GPTConfig, prefix: str, names: tuple[str, str, str], gate: str) -> list[Row]:
    """The rows of every sparse layer's router and experts in a per-expert checkpoint.
    prefix: the layer's MoE module ("model.layers.{i}.mlp."), names: each expert's gate, up
    and down projections ("gate_proj", "up_proj", "down_proj"), gate: the router's name."""
    rows = []
    g, u, d = names
    for i in sparse_layers(c):
        m, b = prefix.format(i=i), f"blocks.{i}.mlp."
        experts = [f"{m}experts.{e}." for e in range(c.moe["n_experts"])]
        rows += [
            (b + "router.weight", [m + gate + ".weight"], False),
            (b + "gate_up", [x + f"{n}.weight" for x in experts for n in (g, u)], False),
            (b + "down", [x + f"{d}.weight" for x in experts], False),
        ]
    return rows


def fused_expert_rows(c: GPTConfig) -> list[Row]:
    """The same in transformers 5.x's modules (mlp.gate, mlp.experts.gate_up_proj/down_proj)."""
    rows = []
    for i in sparse_layers(c):
        m, b = f"model.layers.{i}.mlp.", f"blocks.{i}.mlp."
        rows += [
            (b + "router.weight", [m + "gate.weight"], False),
            (b + "gate_up", [m + "experts.gate_up_proj"], False),
            (b + "down", [m + "experts.down_proj"], False),
        ]
    return rows


def gguf_experts(arch: str, norm_topk: bool | None, shared: bool = False):
    """An MoE family's gguf_check: what llama.cpp's arch assumes of the experts. It puts
    them in every layer; norm_topk: whether it normalizes the top-k weights (None: the
    family's router has no such choice); shared: a gated shared expert in every layer."""

    def check(c: GPTConfig) -> str | None:
        if not c.moe:
            return f"llama.cpp's {arch} needs experts; this model has none"
        if sparse_layers(c) != list(range(c.n_layers)):
            return f"llama.cpp's {arch} has experts in every layer; this model has dense layers"
        if norm_topk is not None and c.moe.get("norm_topk", False) != norm_topk:
            how = "normalizes" if norm_topk else "does not normalize"
            return f"llama.cpp's {arch} {how} the top-k expert weights (norm_topk_prob)"
        if bool(c.moe.get("shared_expert_dim")) != shared:
            need = "a shared expert" if shared else "no shared expert"
            return f"llama.cpp's {arch} has {need} in every layer"
        return None

    return check


def sparse_layers(c: GPTConfig) -> list[int]:
    if not c.moe:
        return []
    chosen = c.moe.get("sparse_layers")
    return list(range(c.n_layers)) if chosen is None else list(chosen)


def rope(hf: dict, source: str) -> tuple[float, dict | None]:
    """(theta, scaling or None) from config.json: transformers 4's rope_theta / rope_scaling
    or transformers 5's rope_parameters, which keeps theta and scaling together."""
    params = hf.get("rope_parameters") or {}
    theta = float(hf.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = hf.get("rope_scaling") or params or None
    if not scaling:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedModel(
            f"{source}: rope scaling {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    if kind == "default":
        return theta, None
    if kind in ("yarn", "longrope"):  # Phi-3 keeps the original context beside rope_scaling
        scaling = dict(scaling)
        old = (
            hf.get("original_max_position_embeddings")
            or scaling.get("original_max_position_embeddings")
            or hf["max_position_embeddings"]
        )
        scaling["original_max_position_embeddings"] = old
        if kind == "longrope" and not scaling.get("factor"):  # as transformers infers it
            scaling["factor"] = hf["max_position_embeddings"] / old
    return theta, scaling


def partial_rotary(hf: dict, head_dim: int) -> int | None:
    factor = (hf.get("rope_parameters") or {}).get("partial_rotary_factor")
    factor = factor or hf.get("partial_rotary_factor") or 1.0
    return None if factor == 1.0 else int(head_dim * factor)


def llama_options(hf: dict, source: str, **extra) -> GPTConfig:
    """The options every Llama-style family shares (RMSNorm, RoPE, SwiGLU, grouped-query
    attention); extra: the family's own."""
    act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
    if act != "silu":
        raise UnsupportedModel(f"{source}: hidden_act {act!r} is not supported (only silu)")
    theta, scaling = rope(hf, source)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    attn_bias = bool(hf.get("attention_bias", False))
    options = {
        "hidden_dim": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": heads,
        "n_kv_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": head_dim,
        "ffn_dim": hf["intermediate_size"],
        "seq_len": hf.get("max_position_embeddings", 2048),
        "vocab_size": hf["vocab_size"],
        "bias": False,
        "norm": "rmsnorm",
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "positions": "rope",
        "rope_theta": theta,
        "rope_scaling": scaling,
        "mlp": "swiglu",
        "qkv_bias": attn_bias,
        "out_bias": attn_bias,
        "mlp_bias": bool(hf.get("mlp_bias", False)),
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }
    return GPTConfig(**{**options, **extra})


def llama_table(c: GPTConfig, post_norms: bool = False) -> list[Row]:
    """Llama's names (q/k/v and gate/up separate, joined into our fused Linears); post_norms:
    Gemma's four norms a layer."""
    rows = [
        ("tok_emb.weight", ["model.embed_tokens.weight"], False),
        ("ln_f.weight", ["model.norm.weight"], False),
    ]
    for i in range(c.n_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        b = f"blocks.{i}."
        if post_norms:
            rows += [
                (b + "ln1.weight", [p + "input_layernorm.weight"], False),
                (b + "ln1_post.weight", [p + "post_attention_layernorm.weight"], False),
                (b + "ln2.weight", [p + "pre_feedforward_layernorm.weight"], False),
                (b + "ln2_post.weight", [p + "post_feedforward_layernorm.weight"], False),
            ]
        else:
            rows += [
                (b + "ln1.weight", [p + "input_layernorm.weight"], False),
                (b + "ln2.weight", [p + "post_attention_layernorm.weight"], False),
            ]
        rows += [
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


def add_one_to_norms(name: str, tensor, c=None, back: bool = False):
    """llama.cpp's Gemma norms scale by their weight: Gemma's 1 + w is written as such, as
    convert_hf_to_gguf.py does (back: read from a GGUF file)."""
    if not name.endswith("norm.weight"):
        return tensor
    return tensor - 1 if back else tensor + 1


def layer_types(hf: dict, every: int) -> list[str]:
    """config.json's layer_types, or (older configs) every every-th layer full attention,
    the others sliding, as transformers fills them in."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    every = hf.get("sliding_window_pattern", every)
    n = hf["num_hidden_layers"]
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]


def check_window_pattern(c: GPTConfig, every: int, what: str) -> str | None:
    """llama.cpp assumes a family's sliding-window pattern: None when c's is that one."""
    expected = [
        "sliding_attention" if (i + 1) % every else "full_attention" for i in range(c.n_layers)
    ]
    if c.sliding_window and list(c.layer_types or ()) != expected:
        return (
            f"llama.cpp's {what} takes every {every}th layer as full attention and the "
            "others as sliding; this model's layer_types differ"
        )
    return None

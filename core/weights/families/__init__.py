"""Model families: one module each (gpt2.py, llama.py, gemma2.py, ...), each a Family of data
and small hooks (base.py): its HF architectures and config.json mapping, model options,
weight-name table, GGUF architecture and tensor hooks, its usual chat format and stop tokens.
This registry lists them; nothing outside the family modules compares family names.

A table row is (our name, [Hugging Face names], transposed). Several Hugging Face names are
concatenated along the first dimension into one of ours (q, k and v into qkv; gate and up into
the SwiGLU fc) and split back on export; transposed marks GPT-2's Conv1D layout. Adding a
family is one module here and its line in FAMILIES.
"""

from __future__ import annotations

from functools import partial

import torch

from core.models.model import GPTConfig, fused_sizes
from core.weights import mxfp4
from core.weights.composite import class_name, is_composite, note, text_config, text_name
from core.weights.families import (
    gemma2,
    gemma3,
    gemma4,
    gpt2,
    gpt_oss,
    llama,
    mistral,
    mixtral,
    olmoe,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_5,
    qwen3_5_moe,
    qwen3_moe,
    qwen3_vl,
    smollm3,
)
from core.weights.families.base import (
    ROPE_TYPES,
    Family,
    Projector,
    Row,
    UnsupportedModel,
    with_defaults,
)

__all__ = ["ROPE_TYPES", "Family", "Projector", "Row", "UnsupportedModel"]

FAMILIES: dict[str, Family] = {
    m.FAMILY.name: m.FAMILY
    for m in (
        gpt2,
        llama,
        mistral,
        qwen2,
        qwen3,
        gemma2,
        gemma3,
        gemma4,
        phi3,
        smollm3,
        qwen3_moe,
        qwen2_moe,
        mixtral,
        olmoe,
        gpt_oss,
        qwen3_5,
        qwen3_5_moe,
        qwen3_vl,
    )
}
SUPPORTED = tuple(FAMILIES)
# config.json model_type -> family (a composite's: its text_config's, core.weights.composite)
_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in (f.name, *f.model_types)}
GGUF_ARCH = {name: f.gguf_arch for name, f in FAMILIES.items()}
# composite class -> how llama.cpp's converter writes its towers (the family's projector)
PROJECTORS = {
    cls: f.projector for f in FAMILIES.values() if f.projector for cls in f.projector.classes
}
HF_ARCH = {name: f.hf_arch for name, f in FAMILIES.items()}


def get(family: str) -> Family:
    return FAMILIES[family]


def projector(hf: dict) -> Projector | None:
    """The projector file's writer of a composite config.json's towers (None: llama.cpp's
    converter writes none for its class)."""
    return PROJECTORS.get(class_name(hf))


def display_list() -> str:
    """'GPT-2, Llama, ...' for help texts and docs."""
    return ", ".join(f.display for f in FAMILIES.values())


# -- config.json -> GPTConfig ------------------------------------------------------------


# config.json fields of mixture-of-experts designs not built here, refused by name
UNBUILT_MOE = {
    "kv_lora_rank": "DeepSeek-V2/V3's multi-head latent attention",
    "n_group": "DeepSeek-V3's grouped expert routing",
    "topk_group": "DeepSeek-V3's grouped expert routing",
    "attention_chunk_size": "Llama 4's chunked attention",
}


def family_of(hf: dict, source: str = "config.json") -> str:
    if hf.get("auto_map"):
        raise UnsupportedModel(
            f"{source}: this model needs its own remote code (auto_map); TrainDeck never runs "
            "code from a model folder. Supported model_type values: " + ", ".join(_BY_MODEL_TYPE)
        )
    for key, what in UNBUILT_MOE.items():
        if text_config(hf).get(key):
            raise UnsupportedModel(
                f"{source}: {key} ({what}) is not supported; the mixture-of-experts designs "
                "supported: " + ", ".join(f.display for f in FAMILIES.values() if f.fused_table)
            )
    if is_composite(hf):
        return _text_family(hf, source)
    family = _BY_MODEL_TYPE.get(hf.get("model_type"))
    if family is None:
        raise UnsupportedModel(
            f"{source}: model_type {hf.get('model_type')!r} is not supported; supported: "
            + ", ".join(_BY_MODEL_TYPE)
        )
    return family.name


def _text_family(hf: dict, source: str) -> str:
    """A composite's family: its language model's; refused naming the class otherwise."""
    text = text_config(hf).get("model_type")
    family = _BY_MODEL_TYPE.get(text)
    if family is None:
        raise UnsupportedModel(
            f"{source}: {class_name(hf)} is not supported: its language model's "
            f"model_type {text!r} is none TrainDeck reads ({', '.join(_BY_MODEL_TYPE)})"
        )
    return family.name


def model_config(hf: dict, source: str = "config.json") -> tuple[str, GPTConfig]:
    """(family, shape) of a Hugging Face config.json mapping (a composite's: of its
    language model); what it leaves out is its transformers class's default."""
    family = family_of(hf, source)
    try:
        return family, FAMILIES[family].config(filled(family, hf), source)
    except KeyError as e:
        raise UnsupportedModel(f"{source}: required field {e} is missing") from None


def filled(family: str, hf: dict) -> dict:
    """The language model's config.json with the keys it leaves out at their defaults."""
    f = FAMILIES[family]
    return with_defaults(text_config(hf), f.defaults, f.aliases)


def notes(family: str, hf: dict) -> list[str]:
    """What the log says when this config.json loads: a composite's kept towers, and the
    family's own notes on its language model."""
    hook = FAMILIES[family].notes
    own = hook(filled(family, hf)) if hook else []
    return ([note(hf)] if is_composite(hf) else []) + own


# -- weight-name tables ---------------------------------------------------------------------


def table(family: str, c: GPTConfig, names=None) -> list[Row]:
    """The family's weight names; names: a file's tensor names (normalised), which pick an
    MoE family's fused table where they have its expert tensors."""
    f = FAMILIES[family]
    if names is not None and f.fused_table is not None:
        fused = f.fused_table(c)
        if any(len(hf) == 1 and hf[0] in names for ours, hf, _ in fused if is_expert(ours)):
            return fused
    return f.table(c)


def is_expert(name: str) -> bool:
    """Whether our tensor name is an MoE layer's stacked experts ([E, ...])."""
    return name.rsplit(".", 1)[-1] in ("gate_up", "down", "gate_up_bias", "down_bias")


def split_rows(name: str, c: GPTConfig, tensor: torch.Tensor, n_parts: int) -> list:
    """One of our tensors cut into the rows of its n_parts Hugging Face tensors (q, k, v,
    SwiGLU's gate, up, or each expert's projections); a LoRA B splits the same way."""
    if n_parts == 1:
        return [tensor]
    if is_expert(name):  # [E, 2I, H] -> gate 0, up 0, gate 1, ...; [E, H, I] -> down 0, ...
        return list(tensor.reshape(-1, *tensor.shape[2:]).chunk(n_parts))
    if ".attn.qkv." in name:  # q k v, or a DeltaNet's four projections
        sizes = fused_sizes(c, int(name.split(".")[1]))
    else:  # gate and up: equal halves (a dense MLP's ffn_dim, a shared expert's own)
        return list(tensor.chunk(n_parts, dim=0))
    return list(tensor.split(sizes, dim=0))


def normalise_hf(names: list[str], family: str) -> dict[str, str]:
    """Map every name a checkpoint may use to the table's: a composite's language model's
    to a CausalLM's, then the family's normalise hook."""
    hook = FAMILIES[family].normalise or (lambda n: n)
    return {hook(text_name(n) or n): n for n in names}


def _join(parts: list, transposed: bool, experts: int | None = None) -> torch.Tensor:
    """experts: per-expert tensors stacked into [experts, ...]."""
    parts = [mxfp4.materialize(p) for p in parts]  # an MXFP4 pair: dequantized now
    if transposed:
        parts = [p.t() for p in parts]
    if len(parts) == 1:
        return parts[0]
    joined = torch.cat(parts, dim=0)
    return joined.view(experts, -1, *parts[0].shape[1:]) if experts else joined


def _joiner(parts: list, transposed: bool, experts: int | None = None):
    """A file tensor itself when nothing has to be joined or turned; else a function that
    joins the parts when called (a memory-mapped model is not joined all at once)."""
    if len(parts) == 1 and not transposed and not isinstance(parts[0], mxfp4.Packed):
        return parts[0]
    return lambda: _join(parts, transposed, experts)


def _converted(convert, ours: str, parts: list, transposed: bool, experts: int):
    return convert(ours, _join(parts, transposed, experts), False)


def import_weights(
    family: str, c: GPTConfig, hf_state: dict, wanted: set[str], lazy: bool = False
) -> dict:
    """Our state dict (names in wanted) from a Hugging Face one; raises naming what is missing.
    lazy: a weight that must be joined (fused q/k/v, gate/up) or transposed comes as a
    function that makes it."""
    names = normalise_hf(list(hf_state), family)
    out = {}
    for ours, hf_names, transposed in table(family, c, names):
        if ours not in wanted:
            continue
        missing = [n for n in hf_names if n not in names]
        if missing:
            raise UnsupportedModel(f"weights: {missing[0]} is missing from the model files")
        parts = [hf_state[names[n]] for n in hf_names]
        experts = c.moe["n_experts"] if is_expert(ours) else None
        convert = FAMILIES[family].convert if experts else None
        if convert is not None:  # the family's own expert layout, made when needed
            make = partial(_converted, convert, ours, parts, transposed, experts)
            out[ours] = make if lazy else make()
            continue
        join = _joiner if lazy else _join
        out[ours] = join(parts, transposed, experts)
    left = sorted(wanted - set(out) - ({"head.weight"} if c.tie_embeddings else set()))
    if left:
        raise UnsupportedModel(f"weights: nothing in the model files maps to {left[0]}")
    return out


def export_weights(family: str, c: GPTConfig, state: dict) -> dict:
    """A Hugging Face state dict from ours (fp32, contiguous)."""
    out = {}
    zero_biases = FAMILIES[family].export_zero_biases
    for ours, hf_names, transposed in table(family, c):
        if ours not in state:
            if zero_biases and ours.endswith(".bias"):  # bias-free: zeros for GPT-2
                weight = state[ours[: -len("bias")] + "weight"]
                out[hf_names[0]] = torch.zeros(weight.shape[0])
            continue
        tensor = state[ours].detach().float().cpu()
        convert = FAMILIES[family].convert
        if convert is not None and is_expert(ours):
            tensor = convert(ours, tensor, True)
        parts = split_rows(ours, c, tensor, len(hf_names))
        for name, part in zip(hf_names, parts, strict=True):
            out[name] = (part.t() if transposed else part).contiguous()
    return out


def export_config(family: str, base_config: dict) -> dict:
    """config.json an hf export of a fine-tune writes: its base's (a composite's whole, its
    class kept), or what the family's hook makes of it."""
    if is_composite(base_config):
        return dict(base_config)
    hook = FAMILIES[family].export_config
    config = hook(base_config) if hook else dict(base_config)
    config["architectures"] = [FAMILIES[family].hf_arch]
    return config


# -- a model TrainDeck created ------------------------------------------------------------


def new_model_family(c: GPTConfig) -> str:
    """The family a model TrainDeck created is, from its shape (GPTConfig.from_train makes
    two): Llama's options (RMSNorm, rotary positions, SwiGLU) are llama, or qwen3 (Llama with
    q/k norms); anything else is TrainDeck's GPT-2-style model."""
    if (c.norm, c.positions, c.mlp) == ("rmsnorm", "rope", "swiglu"):
        return qwen3.FAMILY.name if c.qk_norm else llama.FAMILY.name
    return gpt2.FAMILY.name


def new_model_hf_config(c: GPTConfig) -> dict:
    """config.json for a model TrainDeck created, in the family its shape is (new_model_family):
    no special tokens, as its tokenizer (bytes or TrainDeck's BPE) has none."""
    makers = {
        gpt2.FAMILY.name: gpt2.hf_config,
        llama.FAMILY.name: llama.hf_config,
        qwen3.FAMILY.name: qwen3.hf_config,
    }
    return makers[new_model_family(c)](c)

"""Gemma 3: Gemma 2's layers without soft-capping, with q/k norms, a local RoPE base on the
sliding layers (global ones may scale linearly, x8 on 4B and up) and five sliding layers to
one full. 1B is gemma3_text; 4B/12B/27B are Gemma3ForConditionalGeneration (model_type
gemma3), composites (core.weights.composite) whose language model is this family's and whose
vision tower is kept."""

from __future__ import annotations

import re

import torch

from core.models.model import GPTConfig
from core.weights.families.base import (
    PROJECTOR_SUFFIXES,
    Family,
    Projector,
    add_one_to_norms,
    check_window_pattern,
    rope,
)
from core.weights.families.gemma2 import STOPS, check_scale, gemma_options, gguf_hparams, table


def config(hf: dict, source: str) -> GPTConfig:
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one set of RoPE settings a layer type
        full, local = params["full_attention"] or {}, params.get("sliding_attention") or {}
        theta, scaling = rope({**hf, "rope_parameters": full, "rope_theta": None}, source)
        local_theta = float(local.get("rope_theta") or 10000.0)
    else:
        theta, scaling = rope({"rope_theta": 1_000_000.0, **hf}, source)
        local_theta = float(hf.get("rope_local_base_freq") or 10000.0)
    return GPTConfig(
        **gemma_options(hf, source, every=6),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        qk_norm=True,
        attn_softcap=hf.get("attn_logit_softcapping"),
        logit_softcap=hf.get("final_logit_softcapping"),
    )


def gguf_check(c: GPTConfig) -> str | None:
    if c.rope_local_theta != 10000.0:
        return (
            f"llama.cpp's gemma3 gives sliding layers RoPE base 10000, this model "
            f"{c.rope_local_theta:g}"
        )
    if c.attn_softcap or c.logit_softcap:
        return "llama.cpp's gemma3 has no soft-capping, which this model's config sets"
    return check_scale(c, 62, "gemma3") or check_window_pattern(c, 6, "gemma3")


# -- the projector file: SigLIP and the gemma3 projector (the converter's Gemma3VisionModel) --


def projector_params(w, hf: dict, vision: dict, pre: dict) -> None:
    w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    w.add_vision_use_gelu(True)
    per_side = int(pre.get("image_seq_length", 256) ** 0.5)
    scale = (vision["image_size"] // vision["patch_size"]) // per_side
    if scale > 0 and scale != 4:  # llama.cpp's default pools 4x4 patches into a token
        w.add_vision_projector_scale_factor(scale)


def projector_tensors(name: str, t: torch.Tensor, tmap, vision: dict):
    # transformers 5 names (model.vision_tower.*, vision_tower.embeddings.*) as released
    name = re.sub(r"^model\.", "", name)
    name = re.sub(r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.", name)
    if ".head." in name or not name.startswith(("multi_modal_projector.", "vision_tower.")):
        return
    name = name.replace("_weight", ".weight")
    if "soft_emb_norm.weight" in name:  # Gemma's (1 + w) RMSNorm, stored as llama.cpp reads it
        t = t + 1
    yield tmap.get_name(name, try_suffixes=PROJECTOR_SUFFIXES), t


PROJECTOR = Projector(
    classes=("Gemma3ForConditionalGeneration",),
    vision="gemma3",
    params=projector_params,
    tensors=projector_tensors,
    f32=lambda name: ".embeddings." in name,
)

# Gemma3TextConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "use_bidirectional_attention": False,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="gemma3",
    display="Gemma 3",
    hf_arch="Gemma3ForCausalLM",
    config=config,
    table=table,
    gguf_arch="gemma3",
    model_types=("gemma3_text",),
    chat_format="gemma",
    stops=STOPS,
    gguf_tensor=add_one_to_norms,
    gguf_hparams=gguf_hparams,
    gguf_check=gguf_check,
    projector=PROJECTOR,
)

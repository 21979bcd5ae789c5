"""Qwen3.5 (dense): hybrid layers, three Gated DeltaNet linear-attention layers
(core.models.deltanet) before each full-attention layer (layer_types). The attention layers
gate their output with a sigmoid (q_proj twice as wide), norm q and k per head and turn a
quarter of each head (partial rotary); every RMSNorm scales by 1 + w. Its text model's
config.json is model_type qwen3_5_text (Qwen3_5ForCausalLM)."""

from __future__ import annotations

import torch

from core.models.model import LINEAR, GPTConfig, is_linear, layer_types_problem
from core.weights.families.base import (
    PROJECTOR_SUFFIXES,
    Family,
    Projector,
    UnsupportedModel,
    gguf_tensor_name,
    llama_options,
    llama_table,
    partial_rotary,
)


def text_config(hf: dict) -> dict:
    """The language model's fields (a multimodal config keeps them in text_config)."""
    return {**hf, **hf["text_config"]} if hf.get("text_config") else hf


def layer_types(hf: dict) -> list[str]:
    """config.json's layer_types, or every full_attention_interval-th layer full attention
    and the others linear, as transformers fills them in."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    every = hf.get("full_attention_interval", 4)
    n = hf["num_hidden_layers"]
    return [LINEAR if (i + 1) % every else "full_attention" for i in range(n)]


def config(hf: dict, source: str) -> GPTConfig:
    hf = text_config(hf)
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    c = llama_options(
        hf,
        source,
        qk_norm=True,
        norm_offset=1.0,
        attn_output_gate=True,
        rope_dim=partial_rotary(hf, head_dim),
        layer_types=layer_types(hf),
        linear_attn={
            "n_k_heads": hf.get("linear_num_key_heads", 16),
            "n_v_heads": hf.get("linear_num_value_heads", 32),
            "k_head_dim": hf.get("linear_key_head_dim", 128),
            "v_head_dim": hf.get("linear_value_head_dim", 128),
            "conv_kernel": hf.get("linear_conv_kernel_dim", 4),
        },
    )
    problem = layer_types_problem(c)
    if problem is not None:
        raise UnsupportedModel(f"{source}: {problem}")
    return c


def deltanet_rows(c: GPTConfig) -> list:
    rows = []
    for i in range(c.n_layers):
        if not is_linear(c, i):
            continue
        m, b = f"model.layers.{i}.linear_attn.", f"blocks.{i}.attn."
        projections = [m + f"in_proj_{x}.weight" for x in ("qkv", "z", "b", "a")]
        rows += [
            (b + "qkv.weight", projections, False),
            (b + "conv", [m + "conv1d.weight"], False),
            (b + "dt_bias", [m + "dt_bias"], False),
            (b + "A_log", [m + "A_log"], False),
            (b + "norm.weight", [m + "norm.weight"], False),
            (b + "proj.weight", [m + "out_proj.weight"], False),
        ]
    return rows


def table(c: GPTConfig) -> list:
    """Llama's rows, the linear layers' attention rows replaced by their DeltaNet's."""
    linear = tuple(f"blocks.{i}.attn." for i in range(c.n_layers) if is_linear(c, i))
    rows = [r for r in llama_table(c) if not (linear and r[0].startswith(linear))]
    return rows + deltanet_rows(c)


def gguf_check(c: GPTConfig) -> str | None:
    """llama.cpp's qwen35 takes every full_attention_interval-th layer as attention."""
    kinds = c.layer_types or []
    every = kinds.index("full_attention") + 1 if "full_attention" in kinds else 0
    if not every or kinds != [
        LINEAR if (i + 1) % every else "full_attention" for i in range(c.n_layers)
    ]:
        return (
            "llama.cpp's qwen35 takes every n-th layer as attention and the others as "
            "linear attention; this model's layer_types differ"
        )
    return None


def gguf_hparams(writer, c: GPTConfig) -> None:
    """convert_hf_to_gguf.py's Qwen3.5 keys: the DeltaNet's shape, the attention interval,
    the M-RoPE sections (text: one position for all of them)."""
    o = c.linear_attn
    writer.add_ssm_conv_kernel(o["conv_kernel"])
    writer.add_ssm_state_size(o["k_head_dim"])
    writer.add_ssm_group_count(o["n_k_heads"])
    writer.add_ssm_time_step_rank(o["n_v_heads"])
    writer.add_ssm_inner_size(o["v_head_dim"] * o["n_v_heads"])
    writer.add_full_attention_interval(c.layer_types.index("full_attention") + 1)
    writer.add_rope_dimension_sections(mrope_sections((c.rope_dim or c.head_dim) // 2))


def mrope_sections(pairs: int) -> list[int]:
    """Interleaved M-RoPE's sections (time, height, width, none) over the rotary pairs, pair
    i in section i % 3: Qwen3.5's [11, 11, 10, 0] for 32 pairs. Text has one position in
    each, so only the pairs' cover matters (a pair past its section takes the 4th's 0)."""
    return [-(-(pairs - k) // 3) for k in range(3)] + [0]


def gguf_tensor(name: str, tensor, c: GPTConfig, back: bool = False):
    """llama.cpp's layout, as convert_hf_to_gguf.py writes it: A as -exp(A_log), the conv
    kernel as (channels, kernel), 1 + w in the norms but the DeltaNet's own, and the v heads
    from grouped (by k head) to tiled order where there are more v heads than k heads."""
    if name.endswith("ssm_a"):
        tensor = torch.log(-tensor) if back else -torch.exp(tensor)
    elif name.endswith("ssm_conv1d.weight"):
        tensor = tensor.unsqueeze(1) if back else tensor.squeeze(1)
    elif name.endswith("norm.weight") and "ssm_norm" not in name:
        tensor = tensor - 1 if back else tensor + 1
    return _tiled_v(name, tensor, c, back)


def gguf_adapter(name: str, a, b, c: GPTConfig):
    """A LoRA pair's rows (B) or columns (A, of ssm_out) in the tiled v head order."""
    if name.endswith("ssm_out.weight"):
        return _tiled_v(name, a, c, False), b
    return a, _tiled_v(name, b, c, False)


def _tiled_v(name: str, tensor, c: GPTConfig, back: bool):
    o = c.linear_attn
    n_k, n_v = o["n_k_heads"], o["n_v_heads"]
    if n_k == n_v:
        return tensor
    leaf = name.split(".", 2)[-1]
    dv, qk = o["v_head_dim"], 2 * n_k * o["k_head_dim"]
    if leaf in ("attn_qkv.weight", "ssm_conv1d.weight"):
        return torch.cat((tensor[:qk], _reorder(tensor[qk:], 0, n_k, dv, back)))
    if leaf == "attn_gate.weight":
        return _reorder(tensor, 0, n_k, dv, back)
    if leaf in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
        return _reorder(tensor, 0, n_k, 1, back)
    if leaf == "ssm_out.weight":
        return _reorder(tensor, 1, n_k, dv, back)
    return tensor


def _reorder(t, dim: int, n_k: int, head: int, back: bool):
    """(n_k groups x r heads) <-> (r x n_k) of `head` rows each along dim."""
    shape = list(t.shape)
    r = shape[dim] // head // n_k
    inner = (r, n_k) if back else (n_k, r)
    split = t.reshape(*shape[:dim], *inner, head, *shape[dim + 1 :])
    return split.transpose(dim, dim + 1).reshape(shape).contiguous()


def gguf_rename(hf_name: str) -> str | None:
    """A DeltaNet's dt_bias, which gguf's map lacks (llama.cpp's converter renames it)."""
    parts = hf_name.split(".")
    if parts[-1] == "dt_bias" and parts[1] == "layers":
        return f"blk.{parts[2]}.ssm_dt.bias"
    return None


# -- the projector file: the Qwen3-VL vision tower and merger (the converter's Qwen3VLVisionModel)


def projector_vision(vision: dict) -> dict:
    size = vision.get("image_size") or int(
        vision.get("num_position_embeddings", 2304) ** 0.5 * vision.get("patch_size", 16)
    )
    return {
        **vision,
        "image_size": size,
        "num_attention_heads": vision.get("num_heads"),
        "num_hidden_layers": vision.get("depth"),
    }


def projector_params(w, hf: dict, vision: dict, pre: dict) -> None:
    w.add_vision_use_gelu(True)
    if vision.get("spatial_merge_size") is not None:
        w.add_vision_spatial_merge_size(int(vision["spatial_merge_size"]))
    w.add_vision_attention_layernorm_eps(hf.get("text_config", {}).get("rms_norm_eps", 1e-6))
    deep = [False] * int(vision["num_hidden_layers"] or 0)
    for i in vision.get("deepstack_visual_indexes", []):
        deep[i] = True
    if deep:
        w.add_vision_is_deepstack_layers(deep)


def projector_tensors(name: str, t: torch.Tensor, tmap, vision: dict):
    import gguf

    name = name.replace("model.visual.", "visual.", 1)
    if not name.startswith("visual."):
        return
    if name.startswith("visual.deepstack_merger_list."):
        i, rest = name.split(".", 3)[2:]
        kind = {"norm": "V_DS_NORM", "linear_fc1": "V_DS_FC1", "linear_fc2": "V_DS_FC2"}
        part, suffix = rest.split(".", 1)
        layer = vision.get("deepstack_visual_indexes", [])[int(i)]
        yield gguf_tensor_name(getattr(gguf.MODEL_TENSOR, kind[part]), f".{suffix}", layer), t
    elif name.startswith("visual.merger."):
        part, suffix = name.split(".", 2)[2].split(".", 1)
        if part == "norm":
            yield gguf_tensor_name(gguf.MODEL_TENSOR.V_POST_NORM, f".{suffix}"), t
        else:  # linear_fc1, linear_fc2 -> mm.0, mm.2 (Qwen2-VL's numbering)
            index = {"linear_fc1": 0, "linear_fc2": 2}[part]
            yield gguf_tensor_name(gguf.MODEL_TENSOR.V_MMPROJ, f".{suffix}", index), t
    elif name == "visual.patch_embed.proj.weight":  # Conv3D over 2 frames -> two Conv2Ds
        if t.shape[2] != 2:
            raise UnsupportedModel("mmproj: llama.cpp reads a temporal patch size of 2 only")
        base = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".weight"
        yield base, t[:, :, 0]
        yield base + ".1", t[:, :, 1]
    elif name == "visual.patch_embed.proj.bias":
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".bias", t
    else:
        yield tmap.get_name(name, try_suffixes=PROJECTOR_SUFFIXES), t


def projector_problem(vision: dict) -> str | None:
    t = vision.get("temporal_patch_size", 2)
    return None if t == 2 else f"llama.cpp's qwen3vl reads a temporal patch of 2, this tower {t}"


PROJECTOR = Projector(
    classes=("Qwen3_5ForConditionalGeneration", "Qwen3VLForConditionalGeneration"),
    vision="qwen3vl_merger",
    params=projector_params,
    tensors=projector_tensors,
    problem=projector_problem,
    vision_config=projector_vision,
)

# Qwen3_5TextConfig's defaults: what a released config.json may leave out
DEFAULTS = {
    "vocab_size": 248_320,
    "hidden_size": 4096,
    "intermediate_size": 12_288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "rope_parameters": {
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "rope_type": "default",
    },
}


FAMILY = Family(
    defaults=DEFAULTS,
    name="qwen3_5",
    display="Qwen3.5",
    model_types=("qwen3_5_text",),
    hf_arch="Qwen3_5ForCausalLM",
    config=config,
    table=table,
    gguf_arch="qwen35",
    gguf_check=gguf_check,
    gguf_hparams=gguf_hparams,
    gguf_tensor=gguf_tensor,
    gguf_adapter=gguf_adapter,
    gguf_rename=gguf_rename,
    chat_format="qwen3_5",
    stops=("<|im_end|>",),
    projector=PROJECTOR,
)

"""The projector file (mmproj-model.gguf) of a composite checkpoint: its vision (and audio)
towers and projectors as llama.cpp's own converter writes them (convert_hf_to_gguf.py's
MmprojModel subclasses: Gemma3VisionModel, Qwen3VLVisionModel, Gemma4VisionAudioModel), so
llama.cpp's mtmd (llama-server --mmproj, llama-mtmd-cli) and the apps on it see images with
the fine-tuned text model. The towers are the base's, as training keeps them; their tensors
go through the names and the few changes the converter makes (Gemma 3's +1 on its soft
embedding norm, Qwen3.5's temporal patch split, Gemma 4's patch layout), nothing else."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from core.use import towers
from core.use.common import ExportError
from core.weights import composite
from core.weights.loader import Loaded, read_weights

NAME = "mmproj-model.gguf"
SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")
Tensors = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Projector:
    """How the converter writes one composite class's towers: llama.cpp's projector types,
    the class's own metadata, its tensors under llama.cpp's names, those kept in f32."""

    vision: str  # clip projector type of the vision tower
    params: Callable  # (gguf writer, composite config.json, vision config, preprocessor) -> None
    tensors: Callable  # (name, tensor, tensor map, vision config) -> (gguf name, tensor)...
    f32: Callable[[str], bool] = lambda name: False  # forced f32 (the converter's force_quant)
    audio: str | None = None  # clip projector type of the audio tower, where llama.cpp has one
    vision_config: Callable[[dict], dict] = lambda v: v  # the converter's renamed fields
    # vision config -> what llama.cpp would run otherwise (a shape its graph fixes), or None
    problem: Callable[[dict], str | None] = lambda v: None


# -- Gemma 3: SigLIP and the gemma3 projector (Gemma3VisionModel) ------------------------------


def _gemma3_params(w, hf: dict, vision: dict, pre: dict) -> None:
    w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    w.add_vision_use_gelu(True)
    per_side = int(pre.get("image_seq_length", 256) ** 0.5)
    scale = (vision["image_size"] // vision["patch_size"]) // per_side
    if scale > 0 and scale != 4:  # llama.cpp's default pools 4x4 patches into a token
        w.add_vision_projector_scale_factor(scale)


def _gemma3_tensors(name: str, t: torch.Tensor, tmap, vision: dict) -> Tensors:
    # transformers 5 names (model.vision_tower.*, vision_tower.embeddings.*) as released
    name = re.sub(r"^model\.", "", name)
    name = re.sub(r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.", name)
    if ".head." in name or not name.startswith(("multi_modal_projector.", "vision_tower.")):
        return
    name = name.replace("_weight", ".weight")
    if "soft_emb_norm.weight" in name:  # Gemma's (1 + w) RMSNorm, stored as llama.cpp reads it
        t = t + 1
    yield tmap.get_name(name, try_suffixes=SUFFIXES), t


GEMMA3 = Projector(
    vision="gemma3",
    params=_gemma3_params,
    tensors=_gemma3_tensors,
    f32=lambda name: ".embeddings." in name,
)


# -- Qwen3.5: the Qwen3-VL vision tower and merger (Qwen3VLVisionModel) ------------------------


def _qwen_vision(vision: dict) -> dict:
    size = vision.get("image_size") or int(
        vision.get("num_position_embeddings", 2304) ** 0.5 * vision.get("patch_size", 16)
    )
    return {
        **vision,
        "image_size": size,
        "num_attention_heads": vision.get("num_heads"),
        "num_hidden_layers": vision.get("depth"),
    }


def _qwen_params(w, hf: dict, vision: dict, pre: dict) -> None:
    w.add_vision_use_gelu(True)
    if vision.get("spatial_merge_size") is not None:
        w.add_vision_spatial_merge_size(int(vision["spatial_merge_size"]))
    w.add_vision_attention_layernorm_eps(hf.get("text_config", {}).get("rms_norm_eps", 1e-6))
    deep = [False] * int(vision["num_hidden_layers"] or 0)
    for i in vision.get("deepstack_visual_indexes", []):
        deep[i] = True
    if deep:
        w.add_vision_is_deepstack_layers(deep)


def _qwen_tensors(name: str, t: torch.Tensor, tmap, vision: dict) -> Tensors:
    import gguf

    name = name.replace("model.visual.", "visual.", 1)
    if not name.startswith("visual."):
        return
    if name.startswith("visual.deepstack_merger_list."):
        i, rest = name.split(".", 3)[2:]
        kind = {"norm": "V_DS_NORM", "linear_fc1": "V_DS_FC1", "linear_fc2": "V_DS_FC2"}
        part, suffix = rest.split(".", 1)
        layer = vision.get("deepstack_visual_indexes", [])[int(i)]
        yield _named(getattr(gguf.MODEL_TENSOR, kind[part]), f".{suffix}", layer), t
    elif name.startswith("visual.merger."):
        part, suffix = name.split(".", 2)[2].split(".", 1)
        if part == "norm":
            yield _named(gguf.MODEL_TENSOR.V_POST_NORM, f".{suffix}"), t
        else:  # linear_fc1, linear_fc2 -> mm.0, mm.2 (Qwen2-VL's numbering)
            index = {"linear_fc1": 0, "linear_fc2": 2}[part]
            yield _named(gguf.MODEL_TENSOR.V_MMPROJ, f".{suffix}", index), t
    elif name == "visual.patch_embed.proj.weight":  # Conv3D over 2 frames -> two Conv2Ds
        if t.shape[2] != 2:
            raise ExportError("mmproj: llama.cpp reads a temporal patch size of 2 only")
        base = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".weight"
        yield base, t[:, :, 0]
        yield base + ".1", t[:, :, 1]
    elif name == "visual.patch_embed.proj.bias":
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".bias", t
    else:
        yield tmap.get_name(name, try_suffixes=SUFFIXES), t


def _qwen_problem(vision: dict) -> str | None:
    t = vision.get("temporal_patch_size", 2)
    return None if t == 2 else f"llama.cpp's qwen3vl reads a temporal patch of 2, this tower {t}"


QWEN3_5 = Projector(
    vision="qwen3vl_merger",
    params=_qwen_params,
    tensors=_qwen_tensors,
    problem=_qwen_problem,
    vision_config=_qwen_vision,
)


# -- Gemma 4: its vision and audio towers (Gemma4VisionAudioModel) -----------------------------


def _gemma4_params(w, hf: dict, vision: dict, pre: dict) -> None:
    w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    audio = hf.get("audio_config")
    if audio:
        w.add_audio_num_mel_bins(audio.get("input_feat_size", 128))
        w.add_audio_attention_layernorm_eps(1e-5)


def _is_audio(name: str) -> bool:
    return "audio_tower" in name or "embed_audio" in name


def _gemma4_tensors(name: str, t: torch.Tensor, tmap, vision: dict) -> Tensors:
    if t.dim() == 0:  # the clipped linears' scalar bounds
        t = t.unsqueeze(0)
    if _is_audio(name):
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
    yield tmap.get_name(name, try_suffixes=SUFFIXES), t


def _gemma4_problem(vision: dict) -> str | None:
    k = vision.get("pooling_kernel_size", 3)
    return None if k == 3 else f"llama.cpp's gemma4v pools 3x3 patches, this tower {k}x{k}"


GEMMA4 = Projector(
    vision="gemma4v",
    audio="gemma4a",
    params=_gemma4_params,
    tensors=_gemma4_tensors,
    f32=lambda name: (
        ("position_embedding_table" in name)
        or (_is_audio(name) and (".conv" in name or "_conv" in name) and ".weight" in name)
    ),
    vision_config=lambda v: {**v, "image_size": 224},  # the converter's: llama.cpp ignores it
    problem=_gemma4_problem,
)

# The composite classes llama.cpp's converter writes a projector for.
PROJECTORS = {
    "Gemma3ForConditionalGeneration": GEMMA3,
    "Qwen3_5ForConditionalGeneration": QWEN3_5,
    "Qwen3_5MoeForConditionalGeneration": QWEN3_5,
    "Gemma4ForConditionalGeneration": GEMMA4,
}


def _named(kind, suffix: str, index: int | None = None) -> str:
    import gguf

    base = gguf.TENSOR_NAMES[kind]
    return (base.format(bid=index) if index is not None else base) + suffix


def projector_of(hf: dict) -> Projector | None:
    return PROJECTORS.get(composite.class_name(hf))


def missing_line(hf: dict) -> str | None:
    """One line when llama.cpp has no projector for (some of) this composite's towers."""
    proj = projector_of(hf)
    if proj is None:
        return (
            f"mmproj: llama.cpp has no projector for {composite.class_name(hf)}'s towers; the "
            "GGUF holds the text model alone (text only in llama.cpp and Ollama)"
        )
    problem = proj.problem(hf["vision_config"])
    if problem:
        return f"mmproj: not written: {problem}; the GGUF holds the text model alone"
    if "audio" in composite.towers(hf) and proj.audio is None:
        return (
            "mmproj: llama.cpp has no projector for the audio tower; the mmproj holds vision only"
        )
    return None


# -- the file ------------------------------------------------------------------------------


def _find(config: dict, keys: tuple[str, ...]):
    for key in keys:
        if key in config:
            return config[key]
    raise ExportError(f"mmproj: the tower's config has none of {', '.join(keys)}")


BLOCKS = ("n_layers", "num_hidden_layers", "n_layer", "num_layers", "depth")


def _encoder_params(w, hf: dict, vision: dict, audio: dict | None, pre: dict, proj) -> None:
    """MmprojModel.set_gguf_parameters: each encoder's shape, the text model's width."""
    text = {**hf, **hf.get("text_config", {})}
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(text["hidden_size"])
    w.add_vision_image_size(_find(vision, ("image_size",)))
    w.add_vision_patch_size(_find(vision, ("patch_size",)))
    w.add_vision_embedding_length(_find(vision, ("hidden_size",)))
    w.add_vision_feed_forward_length(_find(vision, ("intermediate_size",)))
    w.add_vision_block_count(_find(vision, BLOCKS))
    w.add_vision_head_count(_find(vision, ("num_attention_heads",)))
    w.add_vision_image_mean(pre["image_mean"])
    w.add_vision_image_std(pre["image_std"])
    if proj.audio is None:  # one encoder's kind: the converter's clip.projector_type
        w.add_clip_projector_type(proj.vision)
        return
    w.add_clip_vision_projector_type(proj.vision)
    if audio is None:
        return
    w.add_clip_has_audio_encoder(True)
    w.add_clip_audio_projector_type(proj.audio)
    w.add_audio_projection_dim(text["hidden_size"])
    w.add_audio_embedding_length(_find(audio, ("hidden_size",)))
    w.add_audio_feed_forward_length(audio.get("intermediate_size", audio["hidden_size"] * 4))
    w.add_audio_block_count(_find(audio, BLOCKS))
    w.add_audio_head_count(_find(audio, ("num_attention_heads",)))


def check(loaded: Loaded) -> dict | None:
    """Before any work: a composite's projector can be written (preprocessor_config.json with
    the image mean and std); returns it, or None for a model without one."""
    hf = loaded.base["hf_config"] if towers.is_composite(loaded) else {}
    proj = projector_of(hf)
    if proj is None or proj.problem(hf["vision_config"]):
        return None
    try:
        pre = json.loads(loaded.base["files"].get("preprocessor_config.json") or "{}")
    except ValueError:
        pre = {}
    if not isinstance(pre, dict) or not {"image_mean", "image_std"} <= set(pre):
        raise ExportError(
            f"mmproj: {loaded.base['init_from']} has no preprocessor_config.json with "
            "image_mean and image_std, which the projector file needs"
        )
    return pre


def write_mmproj(loaded: Loaded, folder: Path, quant: str, log) -> Path | None:
    """The projector file beside the text GGUF; None (and one line) where llama.cpp has none."""
    hf = loaded.base["hf_config"]
    line = missing_line(hf)
    if line:
        log(line)
    pre = check(loaded)
    if pre is None:
        return None
    path = folder / NAME
    tensors = read_weights(towers.base_folder(loaded))  # memory-mapped: towers alone are read
    count, kinds = write(path, hf, pre, tensors, quant)
    log(
        f"mmproj: {path.name}, {count} tensors of the {kinds} (projector {projector_of(hf).vision})"
    )
    log(f"mmproj: with images: llama-server -m model.gguf --mmproj {path.name}")
    return path


def write(path: Path, hf: dict, pre: dict, tensors: dict, quant: str) -> tuple[int, str]:
    """Write the projector file of a composite (config.json, preprocessor_config.json, its
    tensors by name); (tensors written, which towers). Tensors of 2 or more dimensions in f16
    (the converter's default), f32 with --quant f32 and where the converter keeps them f32;
    1-D ones in f32."""
    import gguf

    proj = projector_of(hf)
    vision = proj.vision_config(hf["vision_config"])
    audio = hf.get("audio_config") if proj.audio else None
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    full = quant == "f32"
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if full else gguf.LlamaFileType.MOSTLY_F16)
    _encoder_params(w, hf, vision, audio, pre, proj)
    proj.params(w, hf, vision, pre)
    blocks = 128 if audio else _find(vision, BLOCKS)  # the converter's map for two encoders
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, blocks)
    count = 0
    for name, tensor in tensors.items():
        if composite.text_name(name) is not None or (audio is None and _is_audio(name)):
            continue
        for new, t in proj.tensors(name, tensor, tmap, vision):
            if new is None:
                raise ExportError(f"mmproj: no llama.cpp name for the tower tensor {name}")
            f32 = full or t.dim() <= 1 or proj.f32(name)
            w.add_tensor(new, t.float().numpy() if f32 else t.half().numpy())
            count += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return count, "vision and audio towers" if audio else "vision tower"

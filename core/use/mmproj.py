"""The projector file (mmproj-model.gguf) of a composite checkpoint: its vision (and audio)
towers and projectors as llama.cpp's own converter writes them (convert_hf_to_gguf.py's
MmprojModel subclasses: Gemma3VisionModel, Qwen3VLVisionModel, Gemma4VisionAudioModel), so
llama.cpp's mtmd (llama-server --mmproj, llama-mtmd-cli) and the apps on it see images with
the fine-tuned text model. The towers are the composite's as the hf export writes them: the
base's, or as trained where they trained (--train-vision). Their tensors go through the
names and the few changes the converter makes (Gemma 3's +1 on its soft embedding norm,
Qwen3.5's temporal patch split, Gemma 4's patch layout), nothing else. Those are each
family's own (core.weights.families: a Family's projector, as its chat format);
this module writes the file."""

from __future__ import annotations

import json
from pathlib import Path

from core.use import towers
from core.use.common import ExportError
from core.weights import composite, families
from core.weights.families import Projector
from core.weights.loader import Loaded

NAME = "mmproj-model.gguf"


def projector_of(hf: dict) -> Projector | None:
    """The family's projector of this composite's class (core.weights.families)."""
    return families.projector(hf)


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
    pre = _preprocessor(loaded.base["files"])
    if not isinstance(pre, dict) or not {"image_mean", "image_std"} <= set(pre):
        raise ExportError(
            f"mmproj: {loaded.base['init_from']} has no preprocessor_config.json with "
            "image_mean and image_std, which the projector file needs"
        )
    return pre


def _preprocessor(files: dict) -> dict:
    """The image processor's settings among the base's kept files: preprocessor_config.json
    (released checkpoints), else processor_config.json's image_processor (what transformers 5
    saves), as core.weights.vision.preprocessor reads them from a folder, with the processor's
    image_seq_length (Gemma 3's image tokens, which released files keep beside the rest)."""
    for name, key in (("preprocessor_config.json", None), ("processor_config.json", "image")):
        try:
            found = json.loads(files.get(name) or "{}")
        except ValueError:
            continue
        if key is not None and isinstance(found, dict):
            top = {k: v for k, v in found.items() if k == "image_seq_length"}
            found = {**top, **(found.get("image_processor") or {})}
        if found:
            return found
    return {}


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
    tensors = towers.composite_state(loaded, {})  # the towers as trained (or as they came)
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
        if composite.text_name(name) is not None or (audio is None and proj.is_audio(name)):
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

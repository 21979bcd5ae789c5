"""A composite checkpoint's vision part, as TrainDeck runs it: which classes' towers are built
(core.models.vision), how their chat template marks an image and what the mark expands to,
their image processing (preprocessor_config.json, core.data.images.ImageSpec), and their
tower and projector weights read from the base's files.

Gemma 3 (Gemma3ForConditionalGeneration: SigLIP at a fixed size, pan-and-scan off) is built,
Gemma 4 (Gemma4ForConditionalGeneration's vision encoder: aspect kept, tokens per image vary,
core.models.vision_gemma4), and Qwen3-VL and Qwen3.5 (Qwen3VLForConditionalGeneration,
Qwen3_5ForConditionalGeneration and its MoE's: Qwen's ViT at each image's own resolution,
core.models.vision_qwen); other composites train on text (core.weights.composite) and
refuse image data in one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from core.data.images import ImageSpec
from core.errors import DataError
from core.models.vision import Vision, VisionOptions
from core.models.vision_qwen import QwenVision
from core.weights import composite
from core.weights.files import read_weights

BUILT = {"gemma3": "Gemma3ForConditionalGeneration"}  # model_type -> the class built
# Qwen's dynamic-resolution towers (core.models.vision_qwen; Qwen3-VL's with DeepStack), by
# composite class -> its language model's M-RoPE sections where config.json leaves them out
QWEN = {
    "Qwen3VLForConditionalGeneration": (24, 20, 20),
    "Qwen3_5ForConditionalGeneration": (11, 11, 10),
    "Qwen3_5MoeForConditionalGeneration": (11, 11, 10),
}


def is_qwen(hf: dict) -> bool:
    return composite.class_name(hf) in QWEN


BUILT["gemma4"] = "Gemma4ForConditionalGeneration"  # its encoder (core.models.vision_gemma4)
GEMMA4_SOFT_TOKENS = (70, 140, 280, 560, 1120)  # max_soft_tokens its processor allows


def kind_of(hf: dict) -> str | None:
    """The tower kind TrainDeck runs for this config.json (None: text only here)."""
    if "vision" not in composite.towers(hf):
        return None
    kind = hf.get("model_type")
    return kind if kind in BUILT or is_qwen(hf) else None


def options(hf: dict) -> VisionOptions | None:
    kind = kind_of(hf)
    if kind is None:
        return None
    text = composite.text_config(hf)
    if is_qwen(hf):
        return qwen_options(hf, kind, text)
    if kind in OWN:
        return OWN[kind].options(hf, text)
    return VisionOptions(
        kind=kind,
        config=hf["vision_config"],
        token_id=_token_id(hf, "image"),
        tokens=int(hf.get("mm_tokens_per_image", 256)),
        text_hidden=int(text["hidden_size"]),
        bidirectional=True,  # Gemma 3: an image's tokens see each other
    )


def qwen_options(hf: dict, kind: str, text: dict) -> VisionOptions:
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return VisionOptions(
        kind=kind,
        config=hf["vision_config"],
        token_id=_token_id(hf, "image"),
        tokens=0,  # as many as the image's size gives
        text_hidden=int(text["hidden_size"]),
        mrope_section=tuple(rope.get("mrope_section") or QWEN[composite.class_name(hf)]),
    )


def _gemma4_options(hf: dict, text: dict) -> VisionOptions:
    """Gemma 4: tokens vary per image (at most max_soft_tokens); an image's tokens see each
    other in the sliding layers where use_bidirectional_attention is "vision"; the per-layer
    table reads the pad token at an image token (as transformers' Gemma4Model)."""
    pad = text.get("pad_token_id")
    return VisionOptions(
        kind="gemma4",
        config=hf["vision_config"],
        token_id=_token_id(hf, "image"),
        tokens=max(GEMMA4_SOFT_TOKENS),
        text_hidden=int(text["hidden_size"]),
        bidirectional=text.get("use_bidirectional_attention") == "vision",
        sliding_only=True,
        text_id=int(pad) if pad is not None and text.get("hidden_size_per_layer_input") else None,
    )


def _token_id(hf: dict, what: str) -> int:
    """Gemma 3's image / boi / eoi token ids, under either name transformers has used."""
    keys = {
        "image": ("image_token_id", "image_token_index"),
        "start": ("vision_start_token_id",),
        "end": ("vision_end_token_id",),
        "boi": ("boi_token_id", "boi_token_index"),
        "eoi": ("eoi_token_id", "eoi_token_index"),
    }[what]
    for key in keys:
        if hf.get(key) is not None:
            return int(hf[key])
    raise DataError(f"images: config.json names no {what} token ({' or '.join(keys)})")


def preprocessor(folder: Path) -> dict:
    """The image processor's settings: preprocessor_config.json (as released checkpoints
    have it), else processor_config.json's image_processor (as transformers 5 saves one)."""
    for name, key in (("preprocessor_config.json", None), ("processor_config.json", "image")):
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataError(f"images: {path} cannot be read ({e})") from None
        if key is None:
            return found
        if isinstance(found.get("image_processor"), dict):
            return found["image_processor"]
    raise DataError(
        f"images: {folder} has no preprocessor_config.json: its image processing is unknown; "
        "copy it from the model's original folder"
    )


def image_spec(folder, hf: dict, tokenizer, max_pixels: int | None = None) -> ImageSpec | None:
    """How this model sees images (None: a text-only model, or a class not built here)."""
    kind = kind_of(hf)
    if kind is None:
        return None
    pre = preprocessor(folder)
    if is_qwen(hf):
        return qwen_spec(pre, hf, tokenizer, max_pixels)
    if kind in OWN:
        return OWN[kind].spec(pre, hf, tokenizer, max_pixels)
    size = pre.get("size") or {}
    side = int(hf["vision_config"].get("image_size", 896))
    token = _token_text(tokenizer, _token_id(hf, "image"))
    boi = _token_text(tokenizer, _token_id(hf, "boi"))
    eoi = _token_text(tokenizer, _token_id(hf, "eoi"))
    return ImageSpec(
        kind="fixed",
        placeholder=boi,  # Gemma 3's template writes <start_of_image> for an image part
        token=token,
        token_id=_token_id(hf, "image"),
        before=f"\n\n{boi}",  # as Gemma3Processor's full_image_sequence
        after=f"{eoi}\n\n",
        tokens=int(hf.get("mm_tokens_per_image", pre.get("image_seq_length", 256))),
        height=int(size.get("height", side)),
        width=int(size.get("width", side)),
        max_pixels=max_pixels,
        **pixel_settings(pre, resample=2),  # PIL's BILINEAR
    )


def pixel_settings(
    pre: dict, resample: int, mean=(0.5,) * 3, std=(0.5,) * 3, normalize: bool = True
) -> dict:
    """The processor's resampling, rescaling and normalising (preprocessor_config.json), where
    it leaves one out the kind's processor class's default."""
    return dict(
        resample=int(pre.get("resample", resample)),
        rescale=float(pre.get("rescale_factor", 1 / 255)),
        mean=tuple(pre.get("image_mean", mean)),
        std=tuple(pre.get("image_std", std)),
        do_rescale=bool(pre.get("do_rescale", True)),
        do_normalize=bool(pre.get("do_normalize", normalize)),
    )


def qwen_spec(pre: dict, hf: dict, tokenizer, max_pixels: int | None) -> ImageSpec:
    """Qwen2VLImageProcessor's settings: its template writes <|vision_start|><|image_pad|>
    <|vision_end|> for an image, and the processor repeats <|image_pad|> once per token."""
    v, size = hf["vision_config"], pre.get("size") or {}
    token = _token_text(tokenizer, _token_id(hf, "image"))
    return ImageSpec(
        kind="dynamic",
        placeholder=token,
        token=token,
        token_id=_token_id(hf, "image"),
        before="",
        after="",
        tokens=0,
        height=0,
        width=0,
        max_pixels=max_pixels,
        **pixel_settings(pre, resample=3),  # PIL's BICUBIC
        patch_size=int(pre.get("patch_size", v.get("patch_size", 16))),
        merge_size=int(pre.get("merge_size", v.get("spatial_merge_size", 2))),
        temporal_patch_size=int(pre.get("temporal_patch_size", v.get("temporal_patch_size", 2))),
        min_pixels=int(size.get("shortest_edge", pre.get("min_pixels", 56 * 56))),
        longest=int(size.get("longest_edge", pre.get("max_pixels", 28 * 28 * 1280))),
    )


def gemma4_budget(pre: dict, hf: dict, max_pixels: int | None) -> tuple[int, int, int]:
    """Gemma 4's (patch side, pooling kernel, tokens an image may give): the processor's
    max_soft_tokens, or under --image-max-pixels the largest budget within it."""
    patch = int(pre.get("patch_size", hf["vision_config"].get("patch_size", 16)))
    k = int(pre.get("pooling_kernel_size", hf["vision_config"].get("pooling_kernel_size", 3)))
    soft = int(pre.get("max_soft_tokens", pre.get("image_seq_length", 280)))
    if soft not in GEMMA4_SOFT_TOKENS:
        raise DataError(
            f"images: preprocessor_config.json's max_soft_tokens is {soft}; Gemma 4's processor "
            f"allows {', '.join(map(str, GEMMA4_SOFT_TOKENS))}"
        )
    if max_pixels:
        fits = [
            s for s in GEMMA4_SOFT_TOKENS if s <= soft and s * k * k * patch * patch <= max_pixels
        ]
        if not fits:
            least = GEMMA4_SOFT_TOKENS[0] * k * k * patch * patch
            raise DataError(
                f"images: --image-max-pixels {max_pixels:,} is below Gemma 4's smallest image "
                f"budget ({least:,} pixels: {GEMMA4_SOFT_TOKENS[0]} tokens); raise it"
            )
        soft = max(fits)
    return patch, k, soft


def _gemma4_spec(pre: dict, hf: dict, tokenizer, max_pixels: int | None) -> ImageSpec:
    """Gemma 4's processor: the image resized (bicubic) keeping its aspect ratio to at most
    max_soft_tokens x k^2 patches, sides multiples of k x patch, rescaled to [0, 1], cut into
    patches; the template's <|image|> becomes boi + image x (its tokens) + eoi.
    --image-max-pixels picks the largest of Gemma 4's token budgets within it."""
    patch, k, soft = gemma4_budget(pre, hf, max_pixels)
    token = _token_text(tokenizer, _token_id(hf, "image"))
    return ImageSpec(
        kind="pooled_patches",
        placeholder=token,  # Gemma 4's template writes <|image|> for an image part
        token=token,
        token_id=_token_id(hf, "image"),
        before=_token_text(tokenizer, _token_id(hf, "boi")),  # as Gemma4Processor
        after=_token_text(tokenizer, _token_id(hf, "eoi")),
        tokens=soft,
        height=0,
        width=0,
        max_pixels=max_pixels,
        **pixel_settings(pre, resample=3, mean=(0.0,) * 3, std=(1.0,) * 3, normalize=False),
        patch_size=patch,
        pooling=k,
    )


def tell_specs(specs, pretrained, max_pixels: int | None) -> None:
    """Each data spec told how the model sees images (a problem with its files is said only
    where the data has images: text trains as ever)."""
    seen, why = None, ""
    try:
        seen = image_spec(pretrained.folder, pretrained.hf_config, pretrained.tokenizer, max_pixels)
    except DataError as e:
        why = str(e).removeprefix("images: ")
    for spec in specs:
        spec.images, spec.images_problem = seen, why


def _token_text(tokenizer, token_id: int) -> str:
    text = tokenizer.hf.id_to_token(token_id) if tokenizer.kind != "bytes" else None
    if text is None:
        raise DataError(
            f"images: token {token_id} of config.json is not in the model's tokenizer; its "
            "tokenizer files do not belong to this checkpoint"
        )
    return text


def ours_name(name: str) -> str | None:
    """A composite file's tensor name under the Vision module's names (None: not the
    tower's or projector's, or SigLIP's pooling head, which Gemma 3 does not read)."""
    if composite.text_name(name) is not None:
        return None
    name = re.sub(r"^model\.", "", name)
    name = name.replace("vision_tower.vision_model.", "vision_tower.")
    if name.startswith("vision_tower.head.") or not name.startswith(
        ("vision_tower.", "multi_modal_projector.", "visual.", "embed_vision.")
    ):
        return None
    return name


def tower_state(folder) -> dict[str, torch.Tensor]:
    """The base's tower and projector tensors under the Vision module's names (fp32)."""
    out = {}
    for name, t in read_weights(Path(folder)).items():
        if (mine := ours_name(name)) is not None:
            out[mine] = t.float()
    return out


def file_names(names) -> dict[str, str]:
    """The Vision module's tensor names -> the composite file's (names: the file's)."""
    return {mine: n for n in names if (mine := ours_name(n)) is not None}


def module_name(mine: str) -> str:
    """A Vision module's (or tensor's) name as transformers 5's in-memory composite names it,
    what a PEFT adapter targets: model.vision_tower.encoder.*, model.multi_modal_projector.*
    (the Vision module keeps the class's own names below model.)."""
    return f"model.{mine}"


def trained_state(tower) -> dict[str, torch.Tensor]:
    """A trained tower's tensors under the Vision module's names, adapters merged in."""
    import copy

    from core.models import lora

    merged = copy.deepcopy(tower)
    lora.merge(merged)
    return {k: v.detach() for k, v in merged.state_dict().items()}


def load_vision(folder, hf: dict) -> Vision:
    """The tower and projector of the base at folder, in fp32, frozen."""
    o = options(hf)
    vision = QwenVision(o) if is_qwen(hf) else Vision(o)
    vision.load_state_dict(tower_state(folder))
    return vision.requires_grad_(False)


def tower_dims(hf: dict) -> dict | None:
    """A tower's sizes for the memory estimate (None: no tower TrainDeck runs): layers,
    width, MLP width, heads, patches and tokens per image, pixels per image, and its and
    its projector's parameters, their linear layers' (in, out) included."""
    if kind_of(hf) is None:
        return None
    v = hf["vision_config"]
    if is_qwen(hf):
        return qwen_dims(v)
    kind = kind_of(hf)
    if kind in OWN:  # a tower with its own sizes
        return OWN[kind].dims(hf)
    if not {"image_size", "num_hidden_layers", "num_attention_heads"} <= set(v):
        return None  # a dynamic-resolution tower (Gemma 4's): its patches follow each image
    width, inner = int(v["hidden_size"]), int(v["intermediate_size"])
    side, patch = int(v.get("image_size", 896)), int(v["patch_size"])
    patches, layers = (side // patch) ** 2, int(v["num_hidden_layers"])
    text = int(composite.text_config(hf)["hidden_size"])
    linears = [(width, width)] * 4 + [(width, inner), (inner, width)]  # q, k, v, out; fc1, fc2
    per_layer = 4 * (width * width + width) + 2 * width * inner + inner + width + 4 * width
    embed = 3 * patch * patch * width + width + patches * width
    return {
        "layers": layers,
        "width": width,
        "inner": inner,
        "heads": int(v["num_attention_heads"]),
        "patches": patches,
        "tokens": int(hf.get("mm_tokens_per_image", 256)),
        "pixels": 3 * side * side,
        "params": embed + layers * per_layer + 2 * width,
        "linears": linears * layers,
        "projector": width * text + width,  # Gemma 3's: one matrix and a norm, no linear
    }


def qwen_dims(v: dict) -> dict:
    """Qwen's dynamic tower's sizes (tower_dims): its patches, tokens and pixels follow each
    image (core.training.estimate reads them from the data), so they are per patch here. Its
    parameters and linear layers are counted on the module built on the meta device."""
    import torch.nn as nn

    from core.models.vision_qwen import QwenTower

    with torch.device("meta"):
        tower = QwenTower(v)
    mergers = [tower.merger, *getattr(tower, "deepstack_merger_list", [])]
    merged = sum(p.numel() for m in mergers for p in m.parameters())
    t, p = tower.t, tower.p
    return {
        "dynamic": True,
        "layers": len(tower.blocks),
        "width": int(v["hidden_size"]),
        "inner": int(v["intermediate_size"]),
        "heads": int(v["num_heads"]),
        "merge": tower.merge,
        "patch": p,
        "mergers": len(mergers),  # the merger and DeepStack's
        "out": int(v["out_hidden_size"]),
        "pixels": tower.channels * t * p * p,  # a patch's values
        "params": sum(q.numel() for q in tower.parameters()) - merged,
        "linears": [
            (m.in_features, m.out_features) for m in tower.modules() if type(m) is nn.Linear
        ],
        "projector": merged,
        "whole": 0,  # under LoRA the mergers' linear layers take adapters too
    }


def gemma4_dims(hf: dict) -> dict:
    """Gemma 4's tower's sizes (tower_dims): an image is its token budget's patches, padded
    (core.training.estimate reads the budget from the processor), so they are per patch here;
    counted on the tower and projector built on the meta device."""
    import torch.nn as nn

    from core.models.vision_gemma4 import Gemma4Projector, Gemma4VisionTower, settings

    v, text = settings(hf["vision_config"]), composite.text_config(hf)
    with torch.device("meta"):
        tower = Gemma4VisionTower(v)
        projector = Gemma4Projector(v, 0, int(text["hidden_size"]))
    head = v.get("head_dim") or v["hidden_size"] // v["num_attention_heads"]
    both = [*tower.modules(), *projector.modules()]
    return {
        "pooled": True,
        "layers": len(tower.encoder.layers),
        "width": int(v["hidden_size"]),
        "inner": int(v["intermediate_size"]),
        "heads": int(v["num_attention_heads"]) * head,  # the query's width
        "kv": int(v.get("num_key_value_heads") or v["num_attention_heads"]) * head,
        "out": int(text["hidden_size"]),
        "params": sum(q.numel() for q in tower.parameters()),
        "linears": [(m.in_features, m.out_features) for m in both if type(m) is nn.Linear],
        "projector": sum(q.numel() for q in projector.parameters()),
        "whole": 0,  # its projector is a linear layer: adapters there too
    }


class Own(NamedTuple):
    """A kind whose options, image processing and estimate sizes are its own makers."""

    options: Callable
    spec: Callable
    dims: Callable


OWN = {"gemma4": Own(_gemma4_options, _gemma4_spec, gemma4_dims)}  # by kind

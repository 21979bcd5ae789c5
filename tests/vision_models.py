"""Tiny vision-language checkpoints for the image tests, saved as transformers saves them:
the composite, a tokenizer with the class's image tokens and its real chat template, and the
processor files (preprocessor_config.json, processor_config.json), so transformers' own
AutoProcessor and model are the reference. Also small images of every kind a user brings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from hf_models import TEXT

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
GEMMA3_SPECIALS = ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"]
GEMMA3_IMAGE = ["<start_of_image>", "<image_soft_token>", "<end_of_image>"]
IMAGE_SIZE = 56  # the tiny tower's: 4 x 4 patches of 14, pooled 2 x 2 into 4 tokens
IMAGE_TOKENS = 4


def gemma3_tokenizer(folder: Path):
    """A byte-level BPE with Gemma 3's turn and image tokens and its real chat template."""
    from transformers import PreTrainedTokenizerFast

    from core.data.tokenizer import train_bpe

    hf = train_bpe([TEXT + " red green blue circle square triangle colour shape"], 512).hf
    hf.add_special_tokens(GEMMA3_SPECIALS + GEMMA3_IMAGE)
    template = (TEMPLATES / "google-gemma-3-4b-it.jinja").read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=hf,
        bos_token="<bos>",
        eos_token="<end_of_turn>",
        pad_token="<pad>",
        chat_template=template,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "image_token": "<image_soft_token>",
            "eoi_token": "<end_of_image>",
        },
    )
    tok.save_pretrained(folder)
    return tok


def make_gemma3_vision(
    folder,
    layers: int = 6,
    width: int = 32,
    seed: int = 0,
    std: float = 0.3,
    image_size: int = IMAGE_SIZE,
    tower: dict | None = None,
):
    """A tiny Gemma3ForConditionalGeneration that reads images: SigLIP of 4 x 4 patches
    pooled into 4 image tokens; its processor saved beside it. Returns (model, processor).
    image_size and tower (SiglipVisionConfig's sizes): a larger tower (memory tests)."""
    import transformers as t

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = gemma3_tokenizer(folder)
    ids = {name: tok.convert_tokens_to_ids(name) for name in GEMMA3_IMAGE}
    text = t.Gemma3TextConfig(
        vocab_size=len(tok) + 3,
        hidden_size=width,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    sizes = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    vision = t.SiglipVisionConfig(
        **{**sizes, **(tower or {})},
        image_size=image_size,
        patch_size=14,
        vision_use_head=False,
    )
    config = t.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=IMAGE_TOKENS,
        image_token_id=ids["<image_soft_token>"],
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
    )
    torch.manual_seed(seed)
    model = t.Gemma3ForConditionalGeneration(config)
    for p in model.parameters():  # the towers' init leaves some zero: every tensor differs
        p.data.normal_(0, std)
    model = model.float().eval()
    model.generation_config = t.GenerationConfig(eos_token_id=[tok.eos_token_id])
    model.save_pretrained(folder)
    images = t.Gemma3ImageProcessorPil(
        size={"height": image_size, "width": image_size},
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        do_pan_and_scan=False,
    )
    processor = t.Gemma3Processor(
        image_processor=images,
        tokenizer=tok,
        chat_template=tok.chat_template,
        image_seq_length=IMAGE_TOKENS,
    )
    processor.save_pretrained(folder)
    return model, processor


def reloaded(folder):
    """transformers' model as from_pretrained reads the folder (fp32), the reference."""
    import transformers as t

    return t.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


# -- images ----------------------------------------------------------------------------------


def picture(size=(40, 30), seed: int = 0) -> np.ndarray:
    """Random RGB pixels (H, W, 3) uint8."""
    return np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def save_image(path: Path, kind: str = "png", size=(40, 30), seed: int = 0) -> Path:
    """An image file of a kind: png, jpeg, webp, rgba (PNG with transparency), palette (a
    P-mode PNG), grey, exif (a JPEG whose EXIF says rotate 90 degrees)."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.fromarray(picture(size, seed))
    if kind == "rgba":
        alpha = Image.fromarray(picture(size, seed + 1)[:, :, 0])
        im.putalpha(alpha)
        im.save(path, "PNG")
    elif kind == "palette":
        im.convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(path, "PNG")
    elif kind == "grey":
        im.convert("L").save(path, "PNG")
    elif kind == "exif":
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: rotate 90 clockwise to show
        im.save(path, "JPEG", exif=exif, quality=95)
    else:
        im.save(path, {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[kind])
    return path


# -- Qwen3-VL and Qwen3.5: dynamic resolution ----------------------------------------------------

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_IMAGE = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
QWEN_PATCH = 8  # the tiny towers' patch side: merged 2 x 2, an image's sides are multiples of 16


def conversation(paths, question="What colour?", answer=None) -> list[dict]:
    """A user turn showing the image(s) at paths (one path or a list) and asking question,
    then the answer's turn where one is given."""
    paths = paths if isinstance(paths, list) else [paths]
    parts = [{"type": "image", "image": str(p)} for p in paths]
    user = {"role": "user", "content": [*parts, {"type": "text", "text": question}]}
    return [user] + ([{"role": "assistant", "content": answer}] if answer else [])


def inputs_of(processor, messages, paths):
    """transformers' processor inputs (ids, pixels) for messages showing the images at paths."""
    from PIL import Image

    text = processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=messages[-1]["role"] == "user"
    )
    pictures = [Image.open(p).convert("RGB") for p in paths]
    return processor(text=text, images=pictures, return_tensors="pt")


def colour_chat(folder: Path, n: int) -> Path:
    """chat.jsonl of n conversations, two pictures taking turns: each asks "What colour?" of
    one, answered "blue" or "red" (its images beside it in folder)."""
    import json

    lines = []
    for i in range(n):
        save_image(folder / f"{i % 2}.png", "png", (40, 30), i % 2)
        answer = "red" if i % 2 else "blue"
        lines.append(json.dumps({"messages": conversation(f"{i % 2}.png", answer=answer)}))
    (folder / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return folder / "chat.jsonl"


def qwen_tokenizer(folder: Path):
    """A byte-level BPE with Qwen's turn and vision tokens and Qwen3.5's real chat template
    (it writes an image part as <|vision_start|><|image_pad|><|vision_end|>, as Qwen3-VL's)."""
    from transformers import PreTrainedTokenizerFast

    from core.data.tokenizer import train_bpe

    hf = train_bpe([TEXT + " red green blue circle square triangle colour shape"], 512).hf
    hf.add_special_tokens(QWEN_SPECIALS + QWEN_IMAGE)
    template = (TEMPLATES / "Qwen-Qwen3.5-35B-A3B.jinja").read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=hf,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )
    tok.save_pretrained(folder)
    return tok


def qwen_image_processor(max_pixels: int = 48 * 48):
    import transformers as t

    return t.Qwen2VLImageProcessorPil(
        patch_size=QWEN_PATCH,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": 16 * 16, "longest_edge": max_pixels},
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )


def make_qwen_vision(
    folder,
    kind: str = "qwen3_vl",
    seed: int = 0,
    std: float = 0.3,
    tower: dict | None = None,
    max_pixels: int = 48 * 48,
):
    """A tiny Qwen3VLForConditionalGeneration (kind "qwen3_vl": 3 vision blocks, DeepStack
    from the first two into the first two language layers) or Qwen3_5ForConditionalGeneration
    ("qwen3_5": hybrid language layers, no DeepStack; "qwen3_5_moe": Qwen3_5MoeForConditional-
    Generation, its experts), patches of 8 merged 2 x 2, its
    processor saved beside it (images up to max_pixels). tower: vision config values over
    the tiny ones. Returns (model, processor)."""
    import transformers as t

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = qwen_tokenizer(folder)
    ids = {name: tok.convert_tokens_to_ids(name) for name in QWEN_IMAGE}
    common = dict(
        vocab_size=len(tok) + 3,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    vision = dict(
        depth=3,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        patch_size=QWEN_PATCH,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=32,
        num_position_embeddings=16,
    )
    vision.update(tower or {})
    tokens = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    if kind == "qwen3_vl":
        text = t.Qwen3VLTextConfig(
            num_hidden_layers=3,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [3, 3, 2],
            },
            **common,
        )
        vis = t.Qwen3VLVisionConfig(**vision, deepstack_visual_indexes=[0, 1])
        config, cls = (
            t.Qwen3VLConfig(text_config=text, vision_config=vis, **tokens),
            t.Qwen3VLForConditionalGeneration,
        )
    else:
        moe = kind == "qwen3_5_moe"  # Qwen3.5-35B-A3B's class: 4 experts, top 2, a shared one
        if moe:
            common.pop("intermediate_size")
            common.update(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=16,
                shared_expert_intermediate_size=24,
            )
        text = (t.Qwen3_5MoeTextConfig if moe else t.Qwen3_5TextConfig)(
            num_hidden_layers=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
            },
            **common,
        )
        vis = (t.Qwen3_5MoeVisionConfig if moe else t.Qwen3_5VisionConfig)(**vision)
        config, cls = (
            (t.Qwen3_5MoeConfig if moe else t.Qwen3_5Config)(
                text_config=text, vision_config=vis, **tokens
            ),
            t.Qwen3_5MoeForConditionalGeneration if moe else t.Qwen3_5ForConditionalGeneration,
        )
    torch.manual_seed(seed)
    model = cls(config)
    for p in model.parameters():  # the towers' init leaves some zero: every tensor differs
        p.data.normal_(0, std)
    model = model.float().eval()
    model.generation_config = t.GenerationConfig(eos_token_id=[tok.eos_token_id])
    model.save_pretrained(folder)
    processor = qwen_image_processor(max_pixels)  # Qwen3VLProcessor needs torchvision (its videos)
    processor.save_pretrained(folder)
    return model, processor


def qwen_inputs(processor, tok, text: str, pictures: list):
    """transformers' inputs for text whose <|image_pad|> marks the pictures (PIL images):
    the image processor's pixel values and grids, each mark repeated once per token (as
    Qwen3VLProcessor.replace_image_token), and the token types the model asks for."""
    out = processor(images=pictures, return_tensors="pt") if pictures else {}
    pieces = text.split("<|image_pad|>")
    grids = out["image_grid_thw"].tolist() if pictures else []
    expanded = pieces[0]
    for piece, (t, h, w) in zip(pieces[1:], grids, strict=True):
        expanded += "<|image_pad|>" * (t * h * w // 4) + piece
    ids = torch.tensor([tok(expanded)["input_ids"]])
    image = tok.convert_tokens_to_ids("<|image_pad|>")
    return {**out, "input_ids": ids, "mm_token_type_ids": (ids == image).int()}


def qwen_reloaded(folder):
    import transformers as t

    return t.AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()


# -- Gemma 4 ---------------------------------------------------------------------------------

GEMMA4_SPECIALS = ["<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]
GEMMA4_IMAGE = [
    "<|image>",
    "<|image|>",
    "<image|>",
    "<|audio>",
    "<|audio|>",
    "<audio|>",
    "<|video|>",
]
GEMMA4_PATCH = 4  # the tiny tower's patches: 4 x 4 pixels, pooled 3 x 3 into a token
GEMMA4_TOKENS = 70  # max_soft_tokens: the least of Gemma 4's budgets (about 100 x 100 pixels)


def gemma4_tokenizer(folder: Path):
    """A byte-level BPE with Gemma 4's turn and image tokens and its real chat template."""
    from transformers import PreTrainedTokenizerFast

    from core.data.tokenizer import train_bpe

    hf = train_bpe([TEXT + " red green blue circle square triangle colour shape"], 512).hf
    hf.add_special_tokens(GEMMA4_SPECIALS + GEMMA4_IMAGE)
    template = (TEMPLATES / "google-gemma-4-E2B-it.jinja").read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=hf,
        bos_token="<bos>",
        eos_token="<turn|>",
        pad_token="<pad>",
        chat_template=template,
        extra_special_tokens={
            "boi_token": "<|image>",
            "image_token": "<|image|>",
            "eoi_token": "<image|>",
            "boa_token": "<|audio>",
            "audio_token": "<|audio|>",
            "eoa_token": "<audio|>",
        },
    )
    tok.save_pretrained(folder)
    return tok


def make_gemma4_vision(
    folder, per_layer: bool = False, seed: int = 0, std: float = 0.3, tower: dict | None = None
):
    """A tiny Gemma4ForConditionalGeneration that reads images: its encoder on 4 x 4 patches
    pooled 3 x 3 (clipped linears and standardized output, as released), a language model
    whose image tokens see each other in sliding layers (use_bidirectional_attention
    "vision"); per_layer: the E2B form (per-layer inputs, shared keys and values, double-wide
    MLPs). Its processor saved beside it. tower: vision config values over the tiny ones.
    Returns (model, processor)."""
    import transformers as t
    from hf_models import GEMMA4_CONFIGS

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = gemma4_tokenizer(folder)
    ids = {name: tok.convert_tokens_to_ids(name) for name in GEMMA4_IMAGE}
    shape = (
        GEMMA4_CONFIGS["gemma4"]
        if per_layer
        else {
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "head_dim": 16,
            "global_head_dim": 16,
            "sliding_window": 8,
            "hidden_size_per_layer_input": 0,
        }
    )
    text = t.Gemma4TextConfig(
        vocab_size=len(tok) + 2,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        use_bidirectional_attention="vision",
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        **({**shape, "vocab_size_per_layer_input": len(tok) + 2} if per_layer else shape),
    )
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        patch_size=GEMMA4_PATCH,
        pooling_kernel_size=3,
        position_embedding_size=64,
        use_clipped_linears=True,
        standardize=True,
    )
    vision = t.Gemma4VisionConfig(**{**vision, **(tower or {})})
    config = t.Gemma4Config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        audio_token_id=ids["<|audio|>"],
        video_token_id=ids["<|video|>"],
    )
    torch.manual_seed(seed)
    model = t.Gemma4ForConditionalGeneration(config)
    for p in model.parameters():  # the towers' init leaves some zero: every tensor differs
        p.data.normal_(0, std)
    for name, b in model.named_buffers():  # the clip bounds and standardizing: finite, working
        if name.endswith(("input_min", "output_min")):
            b.fill_(-1.5)
        elif name.endswith(("input_max", "output_max")):
            b.fill_(1.5)
        elif name.endswith("std_bias"):
            b.normal_(0, 0.3)
        elif name.endswith("std_scale"):
            b.uniform_(0.5, 1.5)
    model = model.float().eval()
    model.generation_config = t.GenerationConfig(eos_token_id=[tok.eos_token_id])
    model.save_pretrained(folder)
    images = t.Gemma4ImageProcessorPil(
        patch_size=GEMMA4_PATCH, max_soft_tokens=GEMMA4_TOKENS, pooling_kernel_size=3
    )
    images.save_pretrained(folder)  # preprocessor_config.json, as released
    processor = _images_only()(
        feature_extractor=None,
        image_processor=images,
        tokenizer=tok,
        video_processor=None,
        chat_template=tok.chat_template,
        image_seq_length=GEMMA4_TOKENS,
    )
    return model, processor


def _images_only():
    import transformers as t

    class ImagesOnly(t.Gemma4Processor):
        """transformers' Gemma4Processor without its audio and video halves (its video
        processor needs torchvision): text and images processed as its own."""

        def check_argument_for_proper_class(self, name, arg):
            return None if arg is None else super().check_argument_for_proper_class(name, arg)

    return ImagesOnly


def reloaded4(folder):
    """transformers' Gemma 4 as from_pretrained reads the folder (fp32), the reference."""
    import transformers as t

    return t.Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()

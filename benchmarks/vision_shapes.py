"""A model learns from pictures: shapes and colours drawn with Pillow, a question about each
("What colour is the shape?" / "What shape is it?"), answered by a tiny Gemma 3 composite
(random weights, built with transformers' config classes: tests/vision_models.py) fine-tuned
with TrainDeck on chat data with images, the tower frozen. Held-out accuracy (greedy answer,
through the model's own cached forward with the image) before and after: chance is 1 in 3.
The held-out pictures are drawn apart from the training ones (another seed); each shape is 76
to 96 pixels wide at a random place in a 112-pixel picture, large enough that its outline
reaches the 16 pooled image tokens of the frozen random tower (small shapes blur into one
token: the shape question stayed near chance with shapes 40 to 70 pixels wide).

python benchmarks/vision_shapes.py [--train 300] [--steps 120] [--lora-rank 0]
Prints the accuracy before and after, per question, and the time it took.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220)}
SHAPES = ("circle", "square", "triangle")
QUESTIONS = {"colour": "What colour is the shape?", "shape": "What shape is it?"}
SIZES = (76, 96)  # a shape spans most of the picture: its outline reaches the 4 x 4 tokens
SIDE = 112  # the tower's image: 8 x 8 patches of 14, pooled into 16 tokens


def draw(path: Path, colour: str, shape: str, rng: random.Random) -> None:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (SIDE, SIDE), (255, 255, 255))
    d = ImageDraw.Draw(im)
    size = rng.randint(SIZES[0], SIZES[1])
    x, y = rng.randint(4, SIDE - size - 4), rng.randint(4, SIDE - size - 4)
    fill = COLOURS[colour]
    if shape == "circle":
        d.ellipse((x, y, x + size, y + size), fill=fill)
    elif shape == "square":
        d.rectangle((x, y, x + size, y + size), fill=fill)
    else:
        d.polygon(((x + size // 2, y), (x, y + size), (x + size, y + size)), fill=fill)
    im.save(path)


def make_set(folder: Path, n: int, seed: int) -> list[dict]:
    """n pictures, each asked both questions: [{"image", "colour", "shape"}]."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        path = folder / f"{i}.png"
        draw(path, colour, shape, rng)
        out.append({"image": path, "colour": colour, "shape": shape})
    return out


def messages(item: dict, asks: str, with_answer: bool) -> list[dict]:
    user = {"role": "user", "content": [{"type": "image", "image": str(item["image"])}]}
    user["content"].append({"type": "text", "text": QUESTIONS[asks]})
    answer = [{"role": "assistant", "content": item[asks]}] if with_answer else []
    return [user] + answer


def build_model(folder: Path, tokens: int = 16):
    """A tiny Gemma 3 composite at transformers' own initialisation (its projector, which
    starts at zero, given random weights: a tower whose features reach the language model)."""
    import torch
    import transformers as t
    from vision_models import IMAGE_TOKENS, gemma3_tokenizer  # noqa: F401

    folder.mkdir(parents=True, exist_ok=True)
    tok = gemma3_tokenizer(folder)
    ids = {n: tok.convert_tokens_to_ids(n) for n in ("<start_of_image>", "<image_soft_token>")}
    text = t.Gemma3TextConfig(
        vocab_size=len(tok) + 3,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=32,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    vision = t.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=SIDE,
        patch_size=14,
        vision_use_head=False,
    )
    config = t.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=tokens,
        image_token_id=ids["<image_soft_token>"],
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
    )
    torch.manual_seed(0)
    model = t.Gemma3ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        proj = model.model.multi_modal_projector.mm_input_projection_weight
        proj.normal_(0, vision.hidden_size**-0.5)
    model.generation_config = t.GenerationConfig(eos_token_id=[tok.eos_token_id])
    model.save_pretrained(folder)
    images = t.Gemma3ImageProcessorPil(
        size={"height": SIDE, "width": SIDE}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    t.Gemma3Processor(
        image_processor=images,
        tokenizer=tok,
        chat_template=tok.chat_template,
        image_seq_length=tokens,
    ).save_pretrained(folder)


def accuracy(model, tokenizer, spec, items: list[dict]) -> dict:
    """Greedy answers (through forward_cached with the image) that start with the truth."""
    import torch

    from core.data import images
    from core.data.chat import chat_ids
    from core.use.generate import generate_ids

    right = {k: 0 for k in QUESTIONS}
    for item in items:
        pixels = images.normalized(images.resized(images.open_rgb(item["image"]), spec), spec)
        pixels = torch.from_numpy(pixels)[None]
        for asks in QUESTIONS:
            prompt = chat_ids(tokenizer, messages(item, asks, False), images=spec)
            out = list(generate_ids(model, prompt, 3, temperature=0, images=pixels))
            said = tokenizer.decode(out).strip()
            right[asks] += said.startswith(item[asks])
    return {k: v / len(items) for k, v in right.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=300, help="training pictures (2 questions each)")
    ap.add_argument("--held-out", type=int, default=60)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tune of the LM")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tokens", type=int, default=16, help="image tokens: 16 (pooled 2x2) or 64")
    ap.add_argument(
        "--keep", type=Path, help="copy the base, the run and the held-out pictures here"
    )
    args = ap.parse_args()

    from helpers import tiny_config

    from core.models.vision import attach
    from core.runs.folder import read_metrics
    from core.training.trainer import Trainer
    from core.weights import vision
    from core.weights.loader import load, open_pretrained

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_model(tmp / "base", args.tokens)
        train = make_set(tmp / "data" / "train", args.train, 1)
        held = make_set(tmp / "data" / "held", args.held_out, 2)
        lines = [
            json.dumps({"messages": messages(item, asks, True)})
            for item in train
            for asks in QUESTIONS
        ]
        (tmp / "data" / "train.jsonl").write_text("\n".join(lines), encoding="utf-8")
        pre = open_pretrained(tmp / "base")
        spec = vision.image_spec(tmp / "base", pre.hf_config, pre.tokenizer)

        def scored(model):
            attach(model, vision.load_vision(tmp / "base", pre.hf_config))
            return accuracy(model.eval(), pre.tokenizer, spec, held)

        before = scored(load(tmp / "base").model)
        print(f"before: {before}", flush=True)
        cfg = tiny_config(
            init_from=str(tmp / "base"),
            tokenizer="model",
            data=str(tmp / "data" / "train.jsonl"),
            lora_rank=args.lora_rank,
            lr=args.lr,
            warmup_steps=20,
            max_steps=args.steps,
            batch_size=16,
            eval_every=max(1, args.steps // 2),
            ckpt_every=args.steps,
            dropout=0.0,
            sample_tokens=0,
            seq_len=48 + args.tokens,
            val_fraction=0.02,
        )
        t0 = time.perf_counter()
        Trainer(cfg, tmp / "run", data_cache=tmp / "cache").run()
        seconds = time.perf_counter() - t0
        after = scored(load(tmp / "run", "latest").model)
        _, evals = read_metrics(tmp / "run" / "metrics.jsonl")
        if args.keep:  # e.g. to open the run in the window's Playground
            for part in ("base", "run", "data/held"):
                shutil.copytree(tmp / part, args.keep / part, dirs_exist_ok=True)
    print(f"training: {args.train} pictures x 2 questions, {args.steps} steps, {seconds:.0f} s")
    print(f"val_loss: {evals[0]['val_loss']:.3f} -> {evals[-1]['val_loss']:.3f}")
    print("| question | chance | before | after |")
    print("|---|---|---|---|")
    for k in QUESTIONS:
        print(f"| {k} | 33% | {before[k]:.0%} | {after[k]:.0%} |")
    both = sum(after.values()) / len(after)
    print(f"held-out accuracy after: {both:.0%} ({args.held_out} pictures, both questions)")


if __name__ == "__main__":
    main()

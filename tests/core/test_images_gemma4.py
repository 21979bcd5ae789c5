"""Gemma 4's image processing (core.data.images, kind "pooled_patches"; core.weights.vision): each
image resized keeping its aspect ratio to its token budget, rescaled and cut into patches
with their grid positions, equal to transformers' Gemma 4 image processor's for images of
several sizes, aspect ratios and kinds; the rows' ids equal its processor's, each image
expanded to its own token count; --image-max-pixels picks a smaller budget; an audio part in
the data is one line naming file, line and part."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from vision_models import GEMMA4_TOKENS, make_gemma4_vision, save_image

from core.cli.train import main as train_main
from core.data import images
from core.data.prepare import data_spec, prepare
from core.data.windows import TokenData
from core.errors import DataError
from core.weights import vision
from core.weights.loader import open_pretrained

CASES = [  # kind, (width, height): wide, tall, square, tiny, large, extreme strips
    ("png", (70, 45)),
    ("jpeg", (33, 90)),
    ("webp", (50, 50)),
    ("rgba", (40, 30)),
    ("palette", (64, 20)),
    ("grey", (12, 9)),
    ("exif", (76, 45)),
    ("png", (300, 200)),
    ("png", (1000, 8)),
    ("png", (8, 400)),
]


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("g4") / "base"
    _, processor = make_gemma4_vision(folder)
    return folder, processor


def spec_of(folder, max_pixels=None):
    pre = open_pretrained(folder)
    return vision.image_spec(folder, pre.hf_config, pre.tokenizer, max_pixels)


def asked(path: str, *more: str) -> dict:
    user = [{"type": "image", "image": p} for p in (path, *more)]
    user.append({"type": "text", "text": "What colour?"})
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "red"}]
    }


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_pixel_values_positions_and_token_counts_equal_transformers(gemma4, tmp_path):
    from PIL import Image, ImageOps

    folder, processor = gemma4
    spec = spec_of(folder)
    assert spec.kind == "pooled_patches" and spec.tokens == GEMMA4_TOKENS
    counts = set()
    for n, (kind, size) in enumerate(CASES):
        path = save_image(tmp_path / f"{n}.{kind}", kind, size, n)
        shown = ImageOps.exif_transpose(Image.open(path))
        want = processor.image_processor(images=[shown], return_tensors="np")
        pixels = images.resized(images.open_rgb(path), spec)
        ours = images.pixel_batch([pixels], spec).numpy()
        assert ours.dtype == np.float32
        assert np.array_equal(ours[..., :-2], want["pixel_values"]), (kind, size)
        assert np.array_equal(ours[..., -2:], want["image_position_ids"]), (kind, size)
        tokens = images.image_tokens(spec, pixels)
        assert tokens == want["num_soft_tokens_per_image"][0], (kind, size)
        counts.add(tokens)
    assert len(counts) > 3  # the count follows each image's shape


def test_rows_equal_transformers_processor_ids_each_image_its_own_count(gemma4, tmp_path):
    """Two images of different shapes in one example: the row's ids are the processor's
    (each <|image|> made into boi + its tokens + eoi), image tokens never scored, and the
    row's pixels the processor's, patches and positions."""
    from PIL import Image

    folder, processor = gemma4
    data = tmp_path / "d"
    save_image(data / "wide.png", "png", (70, 45), 1)
    save_image(data / "tall.png", "png", (30, 80), 2)
    records = [asked("wide.png", "tall.png")] * 3
    path = write_jsonl(data / "chat.jsonl", records)
    pre = open_pretrained(folder)
    spec = data_spec(_cfg(path))
    vision.tell_specs([spec], pre, None)
    entry, manifest = prepare(spec, tmp_path / "cache", pre.tokenizer, log=lambda m: None)
    assert manifest["images"] == 2
    rows = TokenData(entry, manifest, 192, 0)
    batch = rows.train_batch(rows.sample_starts(1) * 0)
    text = processor.apply_chat_template(records[0]["messages"], tokenize=False)
    pictures = [Image.open(data / n).convert("RGB") for n in ("wide.png", "tall.png")]
    want = processor(text=text, images=pictures, return_tensors="np")
    n = want["input_ids"].shape[1]
    assert batch[0][0, : n - 1].tolist() == want["input_ids"][0][: n - 1].tolist()
    weights, targets = batch[2][0], batch[1][0]
    assert weights[targets == spec.images.token_id].sum() == 0  # image tokens never count
    assert weights.sum() > 0
    got = batch.images[:2].numpy()
    assert np.array_equal(got[..., :-2], want["pixel_values"])
    assert np.array_equal(got[..., -2:], want["image_position_ids"])


def test_image_max_pixels_picks_a_smaller_budget_or_is_refused(gemma4, tmp_path):
    from PIL import Image

    folder, processor = gemma4
    spec = spec_of(folder, 10_000_000)
    assert spec.tokens == GEMMA4_TOKENS  # never above the checkpoint's own budget
    with pytest.raises(DataError) as e:
        spec_of(folder, 5000)
    assert "--image-max-pixels 5,000 is below Gemma 4's smallest image budget" in str(e.value)
    # a bigger budget, capped back down: as transformers' processor at that budget
    big = processor.image_processor.__class__(
        patch_size=4, max_soft_tokens=140, pooling_kernel_size=3
    )
    path = save_image(tmp_path / "a.png", "png", (90, 60), 3)
    want = big(images=[Image.open(path).convert("RGB")], return_tensors="np")
    capped = spec_of(folder)
    capped = type(capped)(**{**capped.key(), "tokens": 140})
    pixels = images.resized(images.open_rgb(path), capped)
    ours = images.pixel_batch([pixels], capped).numpy()
    assert np.array_equal(ours[..., :-2], want["pixel_values"])


def test_an_audio_part_is_one_line_naming_file_line_and_part(gemma4, tmp_path, capsys):
    folder, _ = gemma4
    save_image(tmp_path / "data" / "good.png")
    sound = {"type": "audio", "audio": "hello.wav"}
    heard = {
        "messages": [{"role": "user", "content": [sound]}, {"role": "assistant", "content": "hi"}]
    }
    path = write_jsonl(tmp_path / "data" / "chat.jsonl", [asked("good.png"), heard])
    cache = tmp_path / "cache"
    args = ["--data", str(path), "--init-from", str(folder), "--tokenizer", "model"]
    args += ["--seq-len", "96", "--prepare-only", "--data-cache", str(cache)]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in e for e in err)
    assert err[-1].startswith(f"error: data: {path} line 2: ")
    assert "'messages'[0].content[0] is of type 'audio'" in err[-1]
    assert "audio and video are not trained on" in err[-1]
    assert not list(cache.glob("*"))


def _cfg(path, **kw):
    from helpers import tiny_config

    return tiny_config(data=str(path), seq_len=192, **kw)

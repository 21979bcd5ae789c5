"""Qwen's images (Qwen3-VL, Qwen3.5): its dynamic resolution (sides multiples of patch x
merge within min and max pixels, --image-max-pixels a lower cap) and patches equal transformers'
Qwen2VLImageProcessor's pixel values and grids; each image's token count follows its size in
the cache's rows; the 3-D positions (M-RoPE) equal transformers' get_rope_index, padding and
packed examples included."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from vision_models import make_qwen_vision, qwen_image_processor, qwen_inputs, save_image

from core.data import images
from core.data.prepare import data_spec, prepare
from core.data.windows import TokenData
from core.models.vision_qwen import rope_index
from core.weights import vision
from core.weights.loader import open_pretrained

KINDS = ("png", "jpeg", "webp", "rgba", "palette", "grey", "exif")
# (width, height): wide, tall, square, under min_pixels (enlarged), over max (shrunk)
SIZES = ((70, 45), (33, 60), (48, 48), (9, 12), (300, 120))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("qvl") / "base"
    _, processor = make_qwen_vision(folder)
    return folder, processor


def spec_of(folder, max_pixels=None):
    pre = open_pretrained(folder)
    return vision.image_spec(folder, pre.hf_config, pre.tokenizer, max_pixels)


def ours(paths, spec):
    return images.pixel_batch([images.resized(images.open_rgb(p), spec) for p in paths], spec)


def theirs(processor, paths):
    from PIL import Image, ImageOps

    shown = [ImageOps.exif_transpose(Image.open(p)) for p in paths]
    return processor(images=shown, return_tensors="pt")


def test_pixel_values_and_grids_equal_transformers_image_processor(qwen, tmp_path):
    """Every kind of file and several sizes and aspect ratios, alone and as one batch: the
    same float32 patches and grids as transformers' processor, and a token per 2 x 2
    patches."""
    folder, processor = qwen
    spec = spec_of(folder)
    assert spec.kind == "dynamic" and (spec.patch_size, spec.merge_size) == (8, 2)
    paths = [
        save_image(tmp_path / f"{n}.{kind}", kind, SIZES[n % len(SIZES)], n)
        for n, kind in enumerate(KINDS)
    ]
    paths += [save_image(tmp_path / f"s{n}.png", "png", s, n) for n, s in enumerate(SIZES)]
    for path in paths:
        got, want = ours([path], spec), theirs(processor, [path])
        assert got.values.dtype == torch.float32
        assert torch.equal(got.values, want["pixel_values"]), path.name
        assert torch.equal(got.grid, want["image_grid_thw"]), path.name
        pixels = images.resized(images.open_rgb(path), spec)
        assert images.image_tokens(spec, pixels) == int(want["image_grid_thw"].prod()) // 4
    got, want = ours(paths, spec), theirs(processor, paths)
    assert torch.equal(got.values, want["pixel_values"])
    assert torch.equal(got.grid, want["image_grid_thw"])
    grids = {tuple(g) for g in got.grid.tolist()}
    assert len(grids) >= 4  # the sizes give different token counts


def test_image_max_pixels_caps_the_processor_s_own(qwen, tmp_path):
    """--image-max-pixels below the processor's longest_edge resizes as the processor would
    with that longest_edge; above it, the processor's own stays."""
    folder, _ = qwen
    path = save_image(tmp_path / "big.png", "png", (300, 120), 5)
    capped = ours([path], spec_of(folder, max_pixels=32 * 32))
    want = theirs(qwen_image_processor(max_pixels=32 * 32), [path])
    assert torch.equal(capped.values, want["pixel_values"])
    assert torch.equal(capped.grid, want["image_grid_thw"])
    assert int(capped.grid.prod()) * 64 <= 32 * 32
    loose = ours([path], spec_of(folder, max_pixels=10**8))
    assert torch.equal(loose.grid, theirs(qwen_image_processor(), [path])["image_grid_thw"])


def test_positions_equal_transformers_get_rope_index(qwen, tmp_path):
    """Two rows, one left-padded, with images of different grids between text: transformers'
    3-D positions and deltas; a packed row gives each example's positions from 0."""
    from transformers import AutoTokenizer
    from vision_models import qwen_reloaded

    folder, processor = qwen
    tok = AutoTokenizer.from_pretrained(folder)
    a = save_image(tmp_path / "a.png", "png", (70, 45), 1)
    b = save_image(tmp_path / "b.png", "png", (33, 60), 2)
    from PIL import Image

    pics = [Image.open(p).convert("RGB") for p in (a, b)]
    one = qwen_inputs(processor, tok, "x <|image_pad|> y <|image_pad|> z", pics)
    two = qwen_inputs(processor, tok, "a b c <|image_pad|> d e f g h", pics[:1])
    n = max(one["input_ids"].shape[1], two["input_ids"].shape[1])
    ids = torch.zeros(2, n, dtype=torch.long)
    valid = torch.zeros(2, n, dtype=torch.bool)
    for r, inputs in enumerate((one, two)):
        k = inputs["input_ids"].shape[1]
        ids[r, n - k :], valid[r, n - k :] = inputs["input_ids"][0], True
    grid = torch.cat([one["image_grid_thw"], two["image_grid_thw"]])
    image = tok.convert_tokens_to_ids("<|image_pad|>")
    model = qwen_reloaded(folder).model
    want, deltas = model.get_rope_index(
        ids, (ids == image).int(), image_grid_thw=grid, attention_mask=valid.long()
    )
    got, our_deltas = rope_index(ids == image, grid, 2, valid=valid)
    assert torch.equal(got[:, valid], want[:, valid])
    assert our_deltas.tolist() == deltas[:, 0].tolist()
    row = torch.cat([one["input_ids"], two["input_ids"]], dim=1)
    restart = torch.zeros_like(row, dtype=torch.bool)
    restart[0, 0] = restart[0, one["input_ids"].shape[1]] = True
    packed, _ = rope_index(row == image, grid, 2, restart=restart)
    alone = [rope_index(x["input_ids"] == image, x["image_grid_thw"], 2)[0] for x in (one, two)]
    assert torch.equal(packed, torch.cat(alone, dim=2))


def test_rows_expand_each_image_to_its_own_tokens(qwen, tmp_path):
    """The cache's rows: each image mark repeated as many times as that image's grid gives
    (input ids equal the processor's), image tokens never scored, and a batch's Patches
    equal the processor's pixel values."""
    from helpers import tiny_config
    from PIL import Image
    from transformers import AutoTokenizer

    folder, processor = qwen
    tok = AutoTokenizer.from_pretrained(folder)
    data = tmp_path / "d"
    save_image(data / "wide.png", "png", (70, 45), 1)
    save_image(data / "tall.png", "png", (33, 60), 2)
    user = [
        {"type": "image", "image": "wide.png"},
        {"type": "image", "image": "tall.png"},
        {"type": "text", "text": "Compare."},
    ]
    record = {
        "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": "red"},
        ]
    }
    path = data / "chat.jsonl"
    path.write_text("\n".join(json.dumps(record) for _ in range(4)) + "\n", encoding="utf-8")
    pre = open_pretrained(folder)
    spec = data_spec(tiny_config(data=str(path), seq_len=96))
    vision.tell_specs([spec], pre, None)
    entry, manifest = prepare(spec, tmp_path / "cache", pre.tokenizer, log=lambda m: None)
    assert manifest["images"] == 2
    rows = TokenData(entry, manifest, 96, 0)
    batch = rows.train_batch(rows.sample_starts(1) * 0)
    text = tok.apply_chat_template(record["messages"], tokenize=False)
    pics = [Image.open(data / n).convert("RGB") for n in ("wide.png", "tall.png")]
    want = qwen_inputs(processor, tok, text, pics)
    k = want["input_ids"].shape[1]
    assert batch[0][0, : k - 1].tolist() == want["input_ids"][0, : k - 1].tolist()
    weights, targets = batch[2][0], batch[1][0]
    assert weights[targets == spec.images.token_id].sum() == 0
    row_images = batch.images
    assert torch.equal(row_images.values[: len(want["pixel_values"])], want["pixel_values"])
    counts = (row_images.grid.prod(-1) // 4).tolist()
    assert sum(counts) == int((batch[0][0] == spec.images.token_id).sum())
    assert np.unique(counts[:2]).size == 2  # two sizes, two counts


def test_an_image_too_narrow_for_qwen_is_one_line(qwen, tmp_path):
    """transformers' smart_resize refuses an aspect ratio over 200; so does ours, as an
    ImageProblem (the data line names the file and line)."""
    folder, _ = qwen
    path = save_image(tmp_path / "strip.png", "png", (1700, 8), 1)
    with pytest.raises(images.ImageProblem, match="an aspect ratio under 200"):
        images.resized(images.open_rgb(path), spec_of(folder))
